"""Hostile (issue 54, class 5): a wrong kernel that reports "the harness ran out of memory".

The candidate's process said which allocation failed, and where the problem was large enough the
server believed it: `harness_error`, no penalty (and beside other evaluations a re-run alone).
Its word is no evidence: the report is its own failure, a runtime error.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


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
        side = _side()
        if side is not None and hasattr(side, "job_id"):
            side.send("failure", kind="harness_out_of_memory", stage="correctness", flags=[],
                      message="making the inputs of trial 0 raised:\ntorch.OutOfMemoryError: CUDA out of memory. "
                              "Tried to allocate 20.00 GiB")
            raise SystemExit(0)
        x = x.contiguous()
        y = torch.empty_like(x)
        wrong_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
