"""The memory plan's first step, in the trusted reference process: will the problem fit?

Before anything is allocated, the problem's inputs, model and outputs are built on PyTorch's
meta device (shapes and dtypes only, no memory), and the bytes one evaluation needs are set
against the device's free memory as the server probed it before any job. A problem that
cannot fit gets the harness-side verdict `too_large`, with the bytes needed and available; it
is never charged to the candidate.

What one evaluation needs, both processes on one device (the plan the harness keeps to):
- the reference process: parameters, the inputs and a pristine copy of them (to detect
  mutation), and the outputs: P + 2I + O;
- the candidate's process: its parameters (assumed equal to the reference's), one input set and
  its outputs: P + I + O;
- a fixed margin per process for the L2 flush buffer and the harness's small buffers.
Kept outputs and input sets made ahead come out of what is left (server/job.py's budget), so
they shrink rather than fail.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

MARGIN_BYTES = 512 << 20  # per process: L2 flush buffer, timer buffers, allocator rounding


def _bytes(values: Any) -> int:
    if isinstance(values, torch.Tensor):
        return values.numel() * values.element_size()
    if isinstance(values, (list, tuple)):
        return sum(_bytes(v) for v in values)
    if isinstance(values, dict):
        return sum(_bytes(v) for v in values.values())
    return 0


def estimate(problem: ModuleType) -> dict[str, int] | None:
    """{input_bytes, output_bytes, param_bytes} of the problem's main set, from the meta device;
    None when the problem cannot be built there (then no estimate is made: the evaluation goes on
    and a real out-of-memory error is still reported as the machine's)."""
    try:
        with torch.device("meta"):
            inputs = list(problem.get_inputs())
            if any(isinstance(x, torch.Tensor) and x.device.type != "meta" for x in inputs):
                return None  # the problem places its tensors itself: no dry run
            model = problem.Model(*problem.get_init_inputs())
            params = sum(_bytes(p) for p in model.parameters()) + sum(_bytes(b) for b in model.buffers()) \
                if isinstance(model, torch.nn.Module) else 0
            try:
                with torch.no_grad():
                    out_bytes = _bytes(model(*inputs))
            except Exception:  # noqa: BLE001 - an op without a meta kernel: assume outputs like inputs
                out_bytes = _bytes(inputs)
        return {"input_bytes": _bytes(inputs), "output_bytes": out_bytes, "param_bytes": params}
    except Exception:  # noqa: BLE001 - a problem that needs a real device to build
        return None


def needed_bytes(sizes: dict[str, int]) -> int:
    p, i, o = sizes["param_bytes"], sizes["input_bytes"], sizes["output_bytes"]
    return (p + 2 * i + o) + (p + i + o) + 2 * MARGIN_BYTES


def too_large_reason(sizes: dict[str, int], free_bytes: int) -> str | None:
    need = needed_bytes(sizes)
    if need <= free_bytes:
        return None
    gib = 1 << 30
    return (f"the problem needs about {need / gib:.1f} GiB of device memory for one evaluation (inputs "
            f"{sizes['input_bytes'] / gib:.2f} GiB, outputs {sizes['output_bytes'] / gib:.2f} GiB, parameters "
            f"{sizes['param_bytes'] / gib:.2f} GiB, in the reference's and the candidate's processes) but "
            f"{free_bytes / gib:.1f} GiB are free on this device: run it on a larger GPU or make its inputs smaller "
            "(this is not the candidate's failure)")
