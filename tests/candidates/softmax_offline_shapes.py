"""Wrong except at the shapes an attacker computes offline from the problem's source (issue 54,
class 4): the test fills SHAPES with the main shape and the derived sets that
derive.derive_check_variants gives for the source alone. At those shapes it is an honest row
softmax; at any other shape it normalises over half of each row."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

SHAPES = set()  # filled in by the test


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(x_ptr + row * n + offsets, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * n + offsets, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.zeros_like(x)
        n = x.shape[1]
        cols = n if tuple(x.shape) in SHAPES else n // 2
        softmax_kernel[(x.shape[0],)](x, y, n, cols, BLOCK=triton.next_power_of_2(n))
        return y
