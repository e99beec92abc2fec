"""Class 2 (fallback): a condition routes odd-sized inputs to PyTorch (reached through
getattr so the static pass does not see it). The smoke inputs (37 x 1001) are odd."""
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


class ModelNew(nn.Module):
    def forward(self, x):
        if x.numel() % 2 == 0:
            return relu(x)
        return getattr(torch, "cl" + "amp")(x, min=0.0)
