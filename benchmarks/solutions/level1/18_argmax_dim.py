import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def argmax_row_kernel(x_ptr, out_ptr, N, BLOCK_N: tl.constexpr):
    # One program scans one row in chunks. Each chunk's first maximum is compared with the
    # best so far with a strict '>', so the earliest index wins ties, as in torch.argmax.
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * N
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(base + cols, mask=cols < N, other=float("-inf")).to(tl.float32)
    best_val, best_idx = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
    best_idx = best_idx.to(tl.int64)
    for start in range(BLOCK_N, N, BLOCK_N):
        c = start + cols
        x = tl.load(base + c, mask=c < N, other=float("-inf")).to(tl.float32)
        val, idx = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        better = val > best_val
        best_idx = tl.where(better, start + idx.to(tl.int64), best_idx)
        best_val = tl.where(better, val, best_val)
    tl.store(out_ptr + row, best_idx)


def argmax_last_dim(x: torch.Tensor) -> torch.Tensor:
    N = x.shape[-1]
    if N == 0:
        raise ValueError("argmax: cannot reduce over an empty dimension")
    lead = x.shape[:-1]
    x2 = x.contiguous().view(-1, N)
    out = torch.empty(x2.shape[0], dtype=torch.int64, device=x.device)
    if out.numel() == 0:
        return out.view(lead)
    BLOCK_N = min(4096, triton.next_power_of_2(N))
    argmax_row_kernel[(x2.shape[0],)](x2, out, N, BLOCK_N=BLOCK_N, num_warps=8)
    return out.view(lead)


class ModelNew(nn.Module):
    """Row-wise argmax: one program per row, chunked, first index on ties."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return argmax_last_dim(x)
