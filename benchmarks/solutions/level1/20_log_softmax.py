import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def log_softmax_kernel(x_ptr, y_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # BLOCK_M rows per program (1 on the GPU). Pass 1: online max and sum of exp over each
    # row, in chunks (rows of any length). Pass 2: y = x - max - log(sum).
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    x_rows = x_ptr + rows[:, None] * N
    y_rows = y_ptr + rows[:, None] * N
    m = tl.full((BLOCK_M, BLOCK_N), float("-inf"), dtype=tl.float32)
    s = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = row_mask[:, None] & (cols < N)[None, :]
        x = tl.load(x_rows + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # lanes that have seen nothing yet stay at (-inf, 0) without producing NaNs
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - safe) + tl.exp(x - safe)
        m = m_new
    row_max = tl.max(m, axis=1)
    safe_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    total = tl.sum(s * tl.exp(m - safe_max[:, None]), axis=1)
    log_z = safe_max + tl.log(tl.where(row_mask, total, 1.0))
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = row_mask[:, None] & (cols < N)[None, :]
        x = tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(y_rows + cols[None, :], (x - log_z[:, None]).to(y_ptr.dtype.element_ty), mask=mask)


def log_softmax_last_dim(x: torch.Tensor) -> torch.Tensor:
    shape = x.shape
    N = shape[-1]
    x2 = x.contiguous().view(-1, N)
    y = torch.empty_like(x2)
    if y.numel() == 0:
        return y.view(shape)
    M = x2.shape[0]
    BLOCK_N = min(4096, triton.next_power_of_2(N))
    # Under the CPU interpreter, blocks of rows: fewer interpreted programs, same masked code.
    BLOCK_M = 1 if x.device.type == "cuda" else max(1, 32768 // BLOCK_N)
    log_softmax_kernel[(triton.cdiv(M, BLOCK_M),)](x2, y, M, N, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=8)
    return y.view(shape)


class ModelNew(nn.Module):
    """Row-wise log-softmax: an online max/sum-of-exp pass, then one write pass."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return log_softmax_last_dim(x)
