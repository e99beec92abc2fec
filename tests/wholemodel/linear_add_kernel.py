"""A Triton linear with bias and a residual add, for a region `linear(x, w, b) + residual`."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _linear_add(x_ptr, w_ptr, b_ptr, r_ptr, y_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pm, pn = tl.program_id(0), tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
        acc += tl.dot(a, w)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0)
    res = tl.load(r_ptr + rm[:, None] * N + rn[None, :], mask=mask, other=0.0)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc + bias[None, :] + res, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, weight, bias, residual):
        k = x.shape[-1]
        n = weight.shape[0]
        x2 = x.reshape(-1, k).contiguous()
        m = x2.shape[0]
        r = residual.reshape(m, n).contiguous()
        y = torch.empty((m, n), device=x.device, dtype=torch.float32)
        grid = (triton.cdiv(m, 32), triton.cdiv(n, 32))
        _linear_add[grid](x2, weight.contiguous(), bias, r, y, m, n, k, BM=32, BN=32, BK=32)
        return y.reshape(*x.shape[:-1], n).to(x.dtype)
