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
# What each process may hold for the harness beyond one set of the problem's bytes (kept outputs of
# timed calls, fresh input sets made ahead; server/timed.py harness_budget): 1.5x the problem's I/O
# bytes, at least HARNESS_FLOOR, within HARNESS_SHARE of the device's free memory.
HARNESS_SHARE = 0.3
HARNESS_FLOOR = 256 << 20


def estimate(problem_source: str) -> dict[str, int] | None:
    """{input_bytes, output_bytes, param_bytes} of the problem's main set, from the meta device
    (harness/derive/'s meta_estimate, which CPU mode uses too); outputs count like the inputs
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


def harness_bytes(io_bytes: int, free_bytes: int | None) -> int:
    """The harness's own bytes in one process beyond the problem's (see HARNESS_SHARE)."""
    budget = max(1.5 * int(io_bytes), HARNESS_FLOOR)
    return int(min(HARNESS_SHARE * free_bytes, budget) if free_bytes else budget)


def reserved_bytes(sizes: dict[str, int], free_bytes: int | None) -> int:
    """What the server's memory ledger reserves for one evaluation beside others (contexts aside):
    needed_bytes, each process's harness bytes, and one more input set each (input sets are made
    ahead whole, and a check's variant inputs live beside the main ones): a full-size evaluation
    peaks well above needed_bytes, and reserving needed_bytes alone let jobs run out of memory
    beside each other (docs/concepts/concurrency.md, "Memory"; scripts/device/memory_probe.py);
    tests/test_memory_plan.py holds the rows. too_large still asks needed_bytes alone: the
    harness's bytes shrink to fit what is free."""
    io = int(sizes["input_bytes"]) + int(sizes["output_bytes"])
    return needed_bytes(sizes) + 2 * harness_bytes(io, free_bytes) + 2 * int(sizes["input_bytes"])


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
