"""Wrong: the cumulative product of the first 48 columns, zeros after them. On rand() inputs the
true values there are below any tolerance, so every check of the problem's own distribution
passes (issue 41, class 5)."""
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
    y = tl.associative_scan(x, 0, _mul)
    y = tl.where(offsets < 48, y, 0.0)
    tl.store(y_ptr + row * n + offsets, y, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.shape[1]
        cumprod_kernel[(x.shape[0],)](x, y, n, BLOCK=triton.next_power_of_2(n))
        return y
