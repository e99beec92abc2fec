"""A shape-specialised ReLU for KernelBench's level1/19_ReLU: it launches n // BLOCK programs,
so it is right only when the element count is a multiple of BLOCK (the main shape's is) and
leaves the ragged tail of any other shape at zero. Correct on the main shape, wrong elsewhere:
the derived check sets must flag it (shape-specialisation), never pass it as a win."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 64


@triton.jit
def _relu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.zeros_like(x)
        n = x.numel()
        grid = (max(n // BLOCK, 1),)  # the main shape's count is a multiple of BLOCK: no tail program
        _relu[grid](x, y, n, BLOCK=BLOCK)
        return y
