import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def matvec_kernel(a_ptr, x_ptr, y_ptr, M, K, stride_am, stride_xk,
                  BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    # Each program owns BLOCK_M rows of A and streams them once along K; the products are
    # accumulated per lane in a (BLOCK_M, BLOCK_K) fp32 tile and reduced at the end.
    pid = tl.program_id(0)
    rm = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    m_mask = rm < M
    a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * stride_am + rk[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = rk < K - k0
        a = tl.load(a_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
        x = tl.load(x_ptr + (k0 + rk) * stride_xk, mask=k_mask, other=0.0).to(tl.float32)
        acc += a * x[None, :]
        a_ptrs += BLOCK_K
    y = tl.sum(acc, axis=1)
    tl.store(y_ptr + rm, y.to(y_ptr.dtype.element_ty), mask=m_mask)


def matvec(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    assert a.dim() == 2 and x.dim() == 2 and x.shape[1] == 1 and a.shape[1] == x.shape[0], \
        "matvec: expects A (M, K) and x (K, 1)"
    a = a.contiguous()
    M, K = a.shape
    y = torch.empty((M, 1), dtype=a.dtype, device=a.device)
    if M == 0:
        return y
    if K == 0:
        raise ValueError("matvec: K == 0 is not supported")
    if a.device.type == "cuda":
        BLOCK_M, BLOCK_K, warps = 16, 256, 4
    else:
        BLOCK_M, BLOCK_K, warps = 64, 1024, 4
    matvec_kernel[(triton.cdiv(M, BLOCK_M),)](a, x, y, M, K, a.stride(0), x.stride(0),
                                              BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K, num_warps=warps)
    return y


class ModelNew(nn.Module):
    """Matrix-vector product: a bandwidth-bound row-block kernel (no tensor cores needed)."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return matvec(a, x)
