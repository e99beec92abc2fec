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
def clamp_scale_kernel(x_ptr, y_ptr, n_elements, lo, hi, scale, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    # The clamp is exact in the input dtype (the bounds are rounded to it, as eager does);
    # the product is rounded once, like eager's fp32-opmath multiply.
    out_ty = y_ptr.dtype.element_ty
    lo_r = round_to(lo + tl.zeros_like(x), out_ty).to(tl.float32)
    hi_r = round_to(hi + tl.zeros_like(x), out_ty).to(tl.float32)
    c = tl.minimum(tl.maximum(x, lo_r), hi_r)
    tl.store(y_ptr + offsets, round_to(c * scale, out_ty), mask=mask)


def clamp_scale(x: torch.Tensor, lo: float, hi: float, scale: float) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return y
    BLOCK_SIZE = 4096
    clamp_scale_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, y, n, lo, hi, scale,
                                                       BLOCK_SIZE=BLOCK_SIZE, num_warps=8)
    return y


class ModelNew(nn.Module):
    """clamp(x, lo, hi) * scale in one pass (bf16 in and out, fp32 math)."""

    def __init__(self, min_val: float, max_val: float, scale: float):
        super().__init__()
        self.min_val = min_val
        self.max_val = max_val
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return clamp_scale(x, self.min_val, self.max_val, self.scale)
