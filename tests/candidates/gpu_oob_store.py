"""Stores far outside its output buffer: an illegal memory access on the GPU."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def oob_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    tl.store(y_ptr + offsets + (1 << 40), x)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        oob_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
