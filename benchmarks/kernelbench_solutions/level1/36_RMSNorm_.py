"""KernelBench level1/36_RMSNorm_: x / sqrt(mean(x^2 over dim 1) + eps), in Triton.

x is viewed as (N, C, S) with S the product of the dims after dim 1. A program takes one
sample and a block of S positions (coalesced along S). Up to 128 channels the (C, block) tile
is held in registers: one read, one write. More channels loop over C twice. Any rank >= 2
and sizes.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

_BLOCK = 1024
_MAX_TILE_C = 128
_TILE_ELEMENTS = 8192


@triton.jit
def _rms_tile_kernel(x_ptr, y_ptr, C, S, eps, C_P2: tl.constexpr, BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ch = tl.arange(0, C_P2)
    mask = (ch[:, None] < C) & (offs[None, :] < S)
    ptrs = n * C * S + ch.to(tl.int64)[:, None] * S + offs[None, :]
    x = tl.load(x_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / C + eps)
    tl.store(y_ptr + ptrs, (x * inv[None, :]).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_kernel(x_ptr, y_ptr, C, S, eps, BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < S
    base = n * C * S + offs
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c in range(0, C):
        x = tl.load(x_ptr + base + c * S, mask=mask, other=0.0).to(tl.float32)
        acc += x * x
    inv = 1.0 / tl.sqrt(acc / C + eps)
    for c in range(0, C):
        x = tl.load(x_ptr + base + c * S, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + base + c * S, (x * inv).to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xc = x.contiguous()
        y = torch.empty_like(xc)
        if xc.numel():
            N, C = xc.shape[0], xc.shape[1]
            S = xc.numel() // (N * C)
            if C <= _MAX_TILE_C:
                c_p2 = triton.next_power_of_2(C)
                block = max(16, min(_TILE_ELEMENTS // c_p2, triton.next_power_of_2(S)))
                _rms_tile_kernel[(N, triton.cdiv(S, block))](xc, y, C, S, self.eps, C_P2=c_p2, BLOCK=block,
                                                             num_warps=8)
            else:
                _rms_kernel[(N, triton.cdiv(S, _BLOCK))](xc, y, C, S, self.eps, BLOCK=_BLOCK, num_warps=4)
        return y
