"""Class 2 (fallback): a kernel that cannot compile, caught, and PyTorch used instead."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def broken_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offsets, tl.no_such_function(tl.load(x_ptr + offsets)))


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        try:
            broken_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
            return y
        except Exception:
            return torch.nn.functional.relu(x)
