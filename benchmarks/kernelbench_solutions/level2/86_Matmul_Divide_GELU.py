"""KernelBench level2/86_Matmul_Divide_GELU: gelu((x @ W.T + b) / divisor) (exact, erf GELU),
one Triton GEMM with the bias and the elementwise tail fused into its epilogue.

IEEE fp32 products with fp32 accumulation (the problem is fp32 at 1e-4), masked edges: any batch
and feature sizes.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

# Tiles: the GPU one for H100-class parts (fp32 IEEE products: no tensor-core TF32, which would
# miss the 1e-4 tolerance); under the CPU interpreter small tiles so ragged edges and the
# grouped order are exercised at test sizes.
_GPU_CONFIG = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, num_warps=8, num_stages=3)
_CPU_CONFIG = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=4, num_warps=4, num_stages=1)


@triton.jit
def _gemm_kernel(a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K,
                 stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
                 stride_cb, stride_cm, stride_cn, p0, p1,
                 HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # Grouped tile order: GROUP_M row tiles sweep the columns together, so B stays in L2.
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    rows_in_group = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows_in_group
    pid_n = (pid % per_group) // rows_in_group

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_mask = rm < M
    n_mask = rn < N
    a_ptrs = a_ptr + batch * stride_ab + rm.to(tl.int64)[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + batch * stride_bb + rk[:, None] * stride_bk + rn.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = rk < K - k0
        a = tl.load(a_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    acc = acc / p0
    acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    c_ptrs = c_ptr + batch * stride_cb + rm.to(tl.int64)[:, None] * stride_cm + rn.to(tl.int64)[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def _config(device: torch.device) -> dict:
    return _GPU_CONFIG if device.type == "cuda" else _CPU_CONFIG


def gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, epilogue: int = 0,
         p0: float = 0.0, p1: float = 0.0) -> torch.Tensor:
    """epilogue(a @ b + bias) for a (M, K) and b (K, N), or batched (B, M, K) and (B, K, N).
    b may be a transposed view (a Linear weight's .t()): only strides are read."""
    batched = a.dim() == 3
    a3 = a if batched else a.unsqueeze(0)
    b3 = b if batched else b.unsqueeze(0)
    assert a3.shape[0] == b3.shape[0] and a3.shape[2] == b3.shape[1], "gemm: shapes do not match"
    B, M, K = a3.shape
    N = b3.shape[2]
    c = torch.empty((B, M, N), dtype=a.dtype, device=a.device)
    if c.numel():
        cfg = _config(a.device)
        grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]), B)
        _gemm_kernel[grid](a3, b3, bias if bias is not None else c, c, M, N, K,
                           a3.stride(0), a3.stride(1), a3.stride(2), b3.stride(0), b3.stride(1), b3.stride(2),
                           c.stride(0), c.stride(1), c.stride(2), float(p0), float(p1),
                           HAS_BIAS=bias is not None, EPILOGUE=epilogue, **cfg)
    return c if batched else c[0]


class ModelNew(nn.Module):
    def __init__(self, input_size, output_size, divisor):
        super().__init__()
        # The same modules in the same order as the problem's Model: equal weights from one seed.
        self.linear = nn.Linear(input_size, output_size)
        self.p = (divisor, 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x @ W.T: W's transposed view, read through its strides.
        return gemm(x, self.linear.weight.t(), self.linear.bias, 1, *self.p)
