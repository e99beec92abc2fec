"""An honest cumulative product: one program per row, Triton's scan."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _mul(a, b):
    return a * b


@triton.jit
def cumprod_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + row * n + offsets, mask=mask, other=1.0)
    tl.store(y_ptr + row * n + offsets, tl.associative_scan(x, 0, _mul), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.shape[1]
        cumprod_kernel[(x.shape[0],)](x, y, n, BLOCK=triton.next_power_of_2(n))
        return y
