import torch
import torch.nn as nn
import triton
import triton.language as tl

_GPU_CONFIG = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, num_warps=8, num_stages=3)
_CPU_CONFIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=256, GROUP_M=8, num_warps=4, num_stages=1)


def _config(device: torch.device) -> dict:
    return _GPU_CONFIG if device.type == "cuda" else _CPU_CONFIG


@triton.jit
def linear_sigmoid_rowsum_kernel(x_ptr, w_ptr, bias_ptr, partial_ptr, M, N, K,
                                 stride_xm, stride_wn, num_n,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                 GROUP_M: tl.constexpr):
    # One (BLOCK_M, BLOCK_N) tile of sigmoid(x @ w^T + bias) is reduced over its columns in
    # the epilogue; the tile's row sums go to partial[row, pid_n]. Nothing of size M x N is
    # ever written.
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    tiles_per_group = GROUP_M * num_n
    group = pid // tiles_per_group
    first_m = group * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % tiles_per_group) % group_rows
    pid_n = (pid % tiles_per_group) // group_rows

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_mask = rm < M
    n_mask = rn < N
    x_ptrs = x_ptr + rm.to(tl.int64)[:, None] * stride_xm + rk[None, :]
    w_ptrs = w_ptr + rn.to(tl.int64)[None, :] * stride_wn + rk[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = rk < K - k0
        a = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    acc += tl.load(bias_ptr + rn, mask=n_mask, other=0.0)[None, :]
    z = tl.exp(-tl.abs(acc))
    sig = tl.where(acc >= 0, 1.0 / (1.0 + z), z / (1.0 + z))
    row_sum = tl.sum(tl.where(n_mask[None, :], sig, 0.0), axis=1)
    tl.store(partial_ptr + rm.to(tl.int64) * num_n + pid_n, row_sum, mask=m_mask)


@triton.jit
def sum_partials_kernel(partial_ptr, y_ptr, M, num_n, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr):
    # y[row] = sum of the row's num_n tile partials, in a fixed order (deterministic).
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = rm < M
    acc = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
    for p0 in range(0, num_n, BLOCK_P):
        rp = p0 + tl.arange(0, BLOCK_P)
        mask = m_mask[:, None] & (rp < num_n)[None, :]
        acc += tl.load(partial_ptr + rm.to(tl.int64)[:, None] * num_n + rp[None, :], mask=mask, other=0.0)
    tl.store(y_ptr + rm, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=m_mask)


def linear_sigmoid_sum(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    N, K = weight.shape
    assert x.shape[-1] == K, "linear_sigmoid_sum: in_features mismatch"
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K).contiguous()
    weight = weight.contiguous()
    M = x2.shape[0]
    y = torch.empty((M,), dtype=x.dtype, device=x.device)
    if M == 0:
        return y.view(*lead, 1)
    if N == 0 or K == 0:
        raise ValueError("linear_sigmoid_sum: empty weight is not supported")
    cfg = _config(x.device)
    num_n = triton.cdiv(N, cfg["BLOCK_N"])
    partial = torch.empty((M, num_n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(M, cfg["BLOCK_M"]) * num_n,)
    linear_sigmoid_rowsum_kernel[grid](x2, weight, bias, partial, M, N, K, x2.stride(0), weight.stride(0),
                                       num_n, **cfg)
    BLOCK_M = 128
    sum_partials_kernel[(triton.cdiv(M, BLOCK_M),)](partial, y, M, num_n, BLOCK_M=BLOCK_M, BLOCK_P=32,
                                                    num_warps=4)
    return y.view(*lead, 1)


class ModelNew(nn.Module):
    """GEMM with bias, sigmoid and the row sum in the epilogue (per-tile partial sums), then
    a tiny kernel that adds each row's partials: the M x N activation never reaches memory."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_sigmoid_sum(x, self.fc.weight, self.fc.bias)
