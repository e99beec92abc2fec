"""One kernel file for both regions of tiny.py, as a scripted model's reply: `forward(x, weight, bias)`
is a Triton LayerNorm over the last dimension when the weight is a vector, a Triton linear layer
(x @ weight.T + bias) when it is a matrix."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _layer_norm(x_ptr, w_ptr, b_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
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


@triton.jit
def _linear(x_ptr, w_ptr, b_ptr, y_ptr, N, K, BN: tl.constexpr, BK: tl.constexpr):
    row = tl.program_id(0)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    x = tl.load(x_ptr + row * K + rk, mask=rk < K, other=0.0)
    w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
    acc = tl.sum(w * x[None, :], axis=1) + tl.load(b_ptr + rn, mask=rn < N, other=0.0)
    tl.store(y_ptr + row * N + rn, acc, mask=rn < N)


class ModelNew(nn.Module):
    def forward(self, x, weight, bias):
        k = x.shape[-1]
        x2 = x.reshape(-1, k).contiguous()
        if weight.dim() == 1:
            y = torch.empty_like(x2)
            _layer_norm[(x2.shape[0],)](x2, weight, bias, y, k, 1e-5, BLOCK=triton.next_power_of_2(k))
            return y.reshape(x.shape)
        n = weight.shape[0]
        y = torch.empty((x2.shape[0], n), dtype=x.dtype, device=x.device)
        _linear[(x2.shape[0],)](x2, weight.contiguous(), bias, y, n, k, BN=triton.next_power_of_2(n),
                                BK=triton.next_power_of_2(k))
        return y.reshape(*x.shape[:-1], n)
