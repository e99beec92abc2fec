"""A Triton LayerNorm over the last dimension, for a region `layer_norm(x, weight, bias)`."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _ln(x_ptr, w_ptr, b_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * n_cols + cols, d / tl.sqrt(var + eps) * w + b, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, weight, bias):
        x = x.contiguous()
        n = x.shape[-1]
        y = torch.empty_like(x)
        _ln[(x.numel() // n,)](x, weight, bias, y, n, 1e-5, BLOCK=triton.next_power_of_2(n))
        return y
