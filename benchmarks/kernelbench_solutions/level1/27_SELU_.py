"""KernelBench level1/27_SELU_: SELU, one streaming Triton kernel.

Any shape: the input is read as one flat array (int64 offsets, a masked tail). The math runs
in fp32 and the result is stored in the input's dtype.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

# 4096 elements per program and 8 warps: 16 per thread, four 128-bit loads in flight.
_BLOCK = 4096


@triton.jit
def _kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = 1.0507009873554805 * tl.where(x > 0, x, 1.6732632423543772 * (tl.exp(tl.minimum(x, 0.0)) - 1.0))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xc = x.contiguous()
        y = torch.empty_like(xc)
        n = xc.numel()
        if n:
            _kernel[(triton.cdiv(n, _BLOCK),)](xc, y, n, BLOCK=_BLOCK, num_warps=8)
        return y
