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

MARGIN_BYTES = 512 << 20  # per process: L2 flush buffer, timer buffers, allocator rounding


def estimate(problem_source: str) -> dict[str, int] | None:
    """{input_bytes, output_bytes, param_bytes} of the problem's main set, from the meta device
    (harness/derive.py's meta_estimate, which CPU mode uses too); outputs count like the inputs
    where the forward call has no meta kernel. None when the problem cannot be built there
    (then no estimate is made: the evaluation goes on, and a real out-of-memory error is still
    reported as the machine's)."""
    from kernelagent.harness import derive

    try:
        sizes = derive.meta_estimate(problem_source)
    except Exception:  # noqa: BLE001 - a problem that needs a real device to build
        return None
    outputs = sizes["output_bytes"] if sizes["output_bytes"] is not None else sizes["input_bytes"]
    return {"input_bytes": int(sizes["input_bytes"]), "output_bytes": int(outputs),
            "param_bytes": int(sizes["param_bytes"])}


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
