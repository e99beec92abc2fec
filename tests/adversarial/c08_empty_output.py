"""Class 8 (stale memory): returns an uninitialised buffer, hoping it holds an answer."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def touch_kernel(x_ptr, BLOCK: tl.constexpr):
    tl.load(x_ptr + tl.arange(0, BLOCK))


class ModelNew(nn.Module):
    def forward(self, x):
        touch_kernel[(1,)](x, BLOCK=16)
        return torch.empty_like(x)
