import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def batchnorm_eval_kernel(x_ptr, mean_ptr, var_ptr, w_ptr, b_ptr, y_ptr, n_elements, C, HW, eps,
                          BLOCK: tl.constexpr):
    # Flat elementwise pass; the per-channel statistics are small gathers that stay in cache.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    c = (offs // HW) % C
    mean = tl.load(mean_ptr + c, mask=mask, other=0.0).to(tl.float32)
    var = tl.load(var_ptr + c, mask=mask, other=1.0).to(tl.float32)
    w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + c, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = (x - mean) * (w / tl.sqrt(var + eps)) + b
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def batchnorm_eval(x: torch.Tensor, mean, var, weight, bias, eps: float) -> torch.Tensor:
    assert x.dim() >= 2 and x.shape[1] == mean.numel(), "batchnorm_eval: channel mismatch"
    x = x.contiguous()
    B, C = x.shape[0], x.shape[1]
    HW = x[0, 0].numel()
    y = torch.empty_like(x)
    if y.numel() == 0:
        return y
    n = y.numel()
    BLOCK = 2048 if x.device.type == "cuda" else 16384
    batchnorm_eval_kernel[(triton.cdiv(n, BLOCK),)](x, mean, var, weight, bias, y, n, C, HW, eps,
                                                     BLOCK=BLOCK, num_warps=8)
    return y


class ModelNew(nn.Module):
    """Inference BatchNorm as one flat elementwise pass (per-channel statistics gathered)."""

    def __init__(self, num_features: int):
        super().__init__()
        self.eps = 1e-5
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(num_features))
        self.bias = nn.Parameter(0.1 * torch.randn(num_features))
        self.register_buffer("running_mean", 0.5 * torch.randn(num_features))
        self.register_buffer("running_var", 0.5 + torch.rand(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return batchnorm_eval(x, self.running_mean, self.running_var, self.weight, self.bias, self.eps)
