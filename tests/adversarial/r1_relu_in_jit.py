"""Hostile (issue 24, class 1): PyTorch's relu called from inside a @triton.jit body. Under the
Triton interpreter (the CPU) a kernel body is Python: it calls a helper that computes the
output with torch (by a computed name, so the static pass sees no torch.relu). The recorder
used to drop every op while a launch was in progress.

Held when the ops inside launches are recorded like any other: aten::relu over the input is
work done by PyTorch. On a GPU the body is compiled and the helper cannot run (the launch fails).
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

_IO = []


def _side():
    x, y = _IO[-1]
    y.copy_(getattr(torch, "re" + "lu")(x))
    return 0


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    if tl.program_id(0) == 0:
        _side()


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _IO[:] = [(x, y)]
        relu_kernel[(1,)](x, y, x.numel(), BLOCK=1024)
        return y
