import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def round_to(x, OUT_DTYPE: tl.constexpr):
    """fp32 -> OUT_DTYPE with round-to-nearest-even.

    For bfloat16 the rounding is done with integer ops, which gives the same bits on a GPU
    and under the Triton CPU interpreter (whose own fp32->bf16 cast truncates).
    """
    if OUT_DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        x = (bits & 0xFFFF0000).to(tl.float32, bitcast=True)
    return x.to(OUT_DTYPE)


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.math.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (x * inv_rms) * w
    tl.store(y_ptr + row * N + cols, round_to(y, y_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    N = weight.numel()
    assert x.shape[-1] == N, "last dimension must match the weight"
    if N > 65536:
        raise ValueError("rms_norm: rows longer than 65536 are not supported by this kernel")
    shape = x.shape
    x2 = x.contiguous().view(-1, N)
    y = torch.empty_like(x2)
    if y.numel() == 0:
        return y.view(shape)
    BLOCK_N = triton.next_power_of_2(N)
    num_warps = 4 if BLOCK_N <= 1024 else (8 if BLOCK_N <= 4096 else 16)
    rmsnorm_kernel[(x2.shape[0],)](x2, weight.contiguous(), y, N, eps, BLOCK_N=BLOCK_N, num_warps=num_warps)
    return y.view(shape)


class ModelNew(nn.Module):
    """RMSNorm, one program per row; fp32 statistics, output in the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
