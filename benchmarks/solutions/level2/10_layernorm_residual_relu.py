import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def layernorm_residual_relu_kernel(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, M, N, eps,
                                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # One program normalises BLOCK_M whole rows held in registers: two-pass statistics,
    # then the affine, the residual add and the ReLU, with one store.
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    offs = rows[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / N
    xc = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(xc * xc, axis=1) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    res = tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.maximum(xc * rstd[:, None] * w[None, :] + b[None, :] + res, 0.0)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def layernorm_residual_relu(x, residual, weight, bias, eps: float) -> torch.Tensor:
    N = weight.numel()
    assert x.shape[-1] == N and residual.shape == x.shape, "layernorm_residual_relu: bad shapes"
    if N > 65536:
        raise ValueError("layernorm_residual_relu: rows longer than 65536 are not supported")
    shape = x.shape
    x2 = x.contiguous().view(-1, N)
    r2 = residual.contiguous().view(-1, N)
    y = torch.empty_like(x2)
    if y.numel() == 0:
        return y.view(shape)
    M = x2.shape[0]
    BLOCK_N = triton.next_power_of_2(N)
    num_warps = 4 if BLOCK_N <= 1024 else (8 if BLOCK_N <= 4096 else 16)
    # One row per program on the GPU; under the CPU interpreter, blocks of rows (fewer
    # interpreted programs, same masked code).
    BLOCK_M = 1 if x.device.type == "cuda" else max(1, 65536 // BLOCK_N)
    layernorm_residual_relu_kernel[(triton.cdiv(M, BLOCK_M),)](x2, r2, weight, bias, y, M, N, eps,
                                                                BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                                                                num_warps=num_warps)
    return y.view(shape)


class ModelNew(nn.Module):
    """LayerNorm, residual add and ReLU fused into one row kernel (one read of each input,
    one write)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden, eps=1e-5)
        with torch.no_grad():  # same parameter initialisation as the reference
            self.ln.weight.copy_(1.0 + 0.1 * torch.randn(hidden))
            self.ln.bias.copy_(0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return layernorm_residual_relu(x, residual, self.ln.weight, self.ln.bias, self.ln.eps)
