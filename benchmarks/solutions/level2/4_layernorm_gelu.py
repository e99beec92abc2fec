import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def layernorm_gelu_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    h = xc * rstd * w + b
    y = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def layer_norm_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    N = weight.numel()
    assert x.shape[-1] == N, "last dimension must match the normalised shape"
    if N > 65536:
        raise ValueError("layer_norm_gelu: rows longer than 65536 are not supported by this kernel")
    shape = x.shape
    x2 = x.contiguous().view(-1, N)
    y = torch.empty_like(x2)
    if y.numel() == 0:
        return y.view(shape)
    BLOCK_N = triton.next_power_of_2(N)
    num_warps = 4 if BLOCK_N <= 1024 else (8 if BLOCK_N <= 4096 else 16)
    layernorm_gelu_kernel[(x2.shape[0],)](x2, weight.contiguous(), bias.contiguous(), y, N, eps,
                                           BLOCK_N=BLOCK_N, num_warps=num_warps)
    return y.view(shape)


class ModelNew(nn.Module):
    """LayerNorm and GELU fused: one read and one write per element."""

    def __init__(self, hidden: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm_gelu(x, self.ln.weight, self.ln.bias, self.ln.eps)
