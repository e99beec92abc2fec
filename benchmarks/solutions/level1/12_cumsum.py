import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def cumsum_row_kernel(x_ptr, y_ptr, N, BLOCK_N: tl.constexpr):
    # One program scans one row, chunk by chunk, carrying the running total.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * N
    y_row = y_ptr + row * N
    carry = tl.sum(tl.zeros((BLOCK_N,), dtype=tl.float32), axis=0)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        scan = tl.cumsum(x, axis=0) + carry
        tl.store(y_row + cols, scan.to(y_ptr.dtype.element_ty), mask=mask)
        carry += tl.sum(x, axis=0)


def cumsum_last_dim(x: torch.Tensor) -> torch.Tensor:
    shape = x.shape
    N = shape[-1]
    x2 = x.contiguous().view(-1, N)
    y = torch.empty_like(x2)
    if y.numel() == 0:
        return y.view(shape)
    cumsum_row_kernel[(x2.shape[0],)](x2, y, N, BLOCK_N=1024, num_warps=4)
    return y.view(shape)


class ModelNew(nn.Module):
    """Row-wise inclusive scan with tl.cumsum over 1024-wide chunks."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cumsum_last_dim(x)
