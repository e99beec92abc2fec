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
def mul_add_kernel(x_ptr, y_ptr, z_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    # The reference rounds x * y to the input dtype before adding z; do the same.
    out_ty = out_ptr.dtype.element_ty
    xy = round_to(x * y, out_ty).to(tl.float32)
    tl.store(out_ptr + offsets, round_to(xy + z, out_ty), mask=mask)


def mul_add(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    assert x.shape == y.shape == z.shape, "mul_add expects equal shapes"
    assert x.dtype == y.dtype == z.dtype, "mul_add expects equal dtypes"
    x, y, z = x.contiguous(), y.contiguous(), z.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return out
    BLOCK_SIZE = 4096
    grid = (triton.cdiv(n, BLOCK_SIZE),)
    mul_add_kernel[grid](x, y, z, out, n, BLOCK_SIZE=BLOCK_SIZE, num_warps=8)
    return out


class ModelNew(nn.Module):
    """out = x * y + z in one pass (bf16 in and out, fp32 math)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return mul_add(x, y, z)
