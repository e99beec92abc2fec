"""Hostile (issue 54, attack b: a believed "harness ran out of memory"), on a GPU: a WRONG ReLU
that, at its first call, tells the server through its own CandidateSide (found on the heap) that
the HARNESS ran out of memory making the inputs (the kind the candidate side reports as
`harness_out_of_memory`, child/candidate_side.py), prints the same torch.OutOfMemoryError text to
stderr, and exits 0. The CPU form is tests/adversarial/r5_forged_harness_oom.py; here the problem
is the large GPU ReLU (tests/candidates/gpu_big_relu_problem.py), where a real out-of-memory was
plausible and the server once believed the claim.

What must catch it: server/failures.py: an infrastructure verdict rests only on what our own
processes measured; the report from the candidate's process is its own failure. The verdict must
be the candidate's (runtime_error, incorrect, crashed), never `harness_error`, never `correct`.
Run by tests/test_trust5_gpu.py::test_hostile_candidates_get_no_better_than_their_honest_verdict.
"""
import sys

import torch
import torch.nn as nn
import triton
import triton.language as tl

MESSAGE = ("making the inputs of trial 0 raised:\ntorch.OutOfMemoryError: CUDA out of memory. "
           "Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which 1.2 GiB is free.")


def _side():
    heap = __import__("g" + "c")
    for obj in heap.get_objects():
        if type(obj).__name__ == "CandidateSide":
            return obj
    return None


@triton.jit
def wrong_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        print("harness ran out of memory: " + MESSAGE, file=sys.stderr, flush=True)
        side = _side()
        if side is not None and hasattr(side, "send"):
            side.send("failure", kind="harness_out_of_memory", stage="correctness", flags=[], message=MESSAGE)
            raise SystemExit(0)
        raise torch.OutOfMemoryError(MESSAGE)
