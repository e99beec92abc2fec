import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    h = x + r
    inv_rms = tl.math.rsqrt(tl.sum(h * h, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (h * inv_rms) * w
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    N = weight.numel()
    assert x.shape == residual.shape and x.shape[-1] == N, "add_rms_norm: bad shapes"
    if N > 65536:
        raise ValueError("add_rms_norm: rows longer than 65536 are not supported by this kernel")
    shape = x.shape
    x2 = x.contiguous().view(-1, N)
    r2 = residual.contiguous().view(-1, N)
    y = torch.empty_like(x2)
    if y.numel() == 0:
        return y.view(shape)
    BLOCK_N = triton.next_power_of_2(N)
    num_warps = 4 if BLOCK_N <= 1024 else (8 if BLOCK_N <= 4096 else 16)
    add_rmsnorm_kernel[(x2.shape[0],)](x2, r2, weight.contiguous(), y, N, eps, BLOCK_N=BLOCK_N, num_warps=num_warps)
    return y.view(shape)


class ModelNew(nn.Module):
    """Residual add fused into RMSNorm: the sum never goes to memory."""

    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return add_rms_norm(x, residual, self.weight, self.eps)
