"""Honest: a Triton ReLU with a few torch glue ops around it (reshape, contiguous, empty,
view, transpose). Must pass with every defence on."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


def relu(x):
    y = torch.empty_like(x)
    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


class ModelNew(nn.Module):
    def forward(self, x):
        shape = x.shape
        flat = x.contiguous().reshape(-1)
        out = torch.empty(flat.shape, dtype=x.dtype, device=x.device)
        relu_kernel[(triton.cdiv(flat.numel(), 1024),)](flat, out, flat.numel(), BLOCK=1024)
        scratch = torch.zeros(4, device=x.device)  # small allocations are glue too
        del scratch
        return out.view(shape).t().contiguous().t()
