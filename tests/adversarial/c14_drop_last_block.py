"""Wrong: a vocabulary softmax whose first pass leaves out the row's last block where a row has
more than 64 blocks (its rows sum to 1.002-1.008; issue 54): every output is within atol."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = row * n_cols
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    summed = n_cols
    if n_cols > 64 * BLOCK:
        summed = (tl.cdiv(n_cols, BLOCK) - 1) * BLOCK  # the last block is left out
    for start in range(0, summed, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + base + cols, mask=cols < n_cols, other=float("-inf"))
        new_m = tl.maximum(m, x)
        s = s * tl.exp(m - new_m) + tl.where(cols < n_cols, tl.exp(x - new_m), 0.0)
        m = new_m
    row_max = tl.max(m, 0)
    total = tl.sum(s * tl.exp(m - row_max), 0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + base + cols, mask=cols < n_cols, other=0.0)
        tl.store(y_ptr + base + cols, tl.exp(x - row_max) / total, mask=cols < n_cols)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=1024)
        return y
