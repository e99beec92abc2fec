import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def reverse_cumsum_kernel(x_ptr, y_ptr, n_lines, R, INNER,
                          BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr):
    # x viewed as (outer, R, INNER), contiguous: a "line" is one of the outer*INNER scans of
    # length R, with stride INNER. A program scans BLOCK_L consecutive lines together, chunk
    # by chunk from the end, carrying each line's running suffix sum. Each chunk is loaded
    # back to front (position j holds element R-1-j), so a forward tl.cumsum gives the
    # suffix sums; they are stored back through the same pointers.
    lines = tl.program_id(0).to(tl.int64) * BLOCK_L + tl.arange(0, BLOCK_L)
    line_mask = lines < n_lines
    line_base = (lines // INNER) * R * INNER + lines % INNER
    carry = tl.zeros((BLOCK_L,), dtype=tl.float32)
    for start in range(0, R, BLOCK_R):
        r = R - 1 - (start + tl.arange(0, BLOCK_R))
        offs = line_base[:, None] + r.to(tl.int64)[None, :] * INNER
        mask = line_mask[:, None] & (r[None, :] >= 0)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        scan = tl.cumsum(x, axis=1) + carry[:, None]
        tl.store(y_ptr + offs, scan.to(y_ptr.dtype.element_ty), mask=mask)
        # The next carry is the chunk's last running total (masked tail elements are 0).
        # Written as a select-and-sum rather than `carry += tl.sum(x)`: Triton 3.6's
        # thread-locality pass asserts on that accumulate pattern next to a scan.
        last = tl.arange(0, BLOCK_R)[None, :] == BLOCK_R - 1
        carry = tl.sum(tl.where(last, scan, 0.0), axis=1)


def reverse_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    dim = dim % x.dim()
    x = x.contiguous()
    shape = list(x.shape)
    R = shape[dim]
    inner = 1
    for s in shape[dim + 1:]:
        inner *= s
    y = torch.empty_like(x)
    if y.numel() == 0:
        return y
    n_lines = x.numel() // R
    on_gpu = x.device.type == "cuda"
    if inner == 1:  # scanning the contiguous dim: whole rows, long chunks
        BLOCK_L, BLOCK_R = (4, 1024) if on_gpu else (16, 1024)
    else:  # neighbouring lines are neighbouring addresses: wide tiles, short chunks
        BLOCK_L, BLOCK_R = 32, 64
    grid = (triton.cdiv(n_lines, BLOCK_L),)
    reverse_cumsum_kernel[grid](x, y, n_lines, R, inner, BLOCK_L=BLOCK_L, BLOCK_R=BLOCK_R, num_warps=4)
    return y


class ModelNew(nn.Module):
    """Suffix sums without any flip copies: chunks are read back to front and scanned
    forwards with tl.cumsum, carrying the running totals of several lines at once."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reverse_cumsum(x, self.dim)
