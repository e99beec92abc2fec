"""Class 14 (tolerance blind spot): all zeros, every element within atol of the softmax."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def zero_kernel(y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offsets, tl.zeros((BLOCK,), dtype=tl.float32), mask=offsets < n)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        zero_kernel[(triton.cdiv(x.numel(), 65536),)](y, x.numel(), BLOCK=65536)
        return y
