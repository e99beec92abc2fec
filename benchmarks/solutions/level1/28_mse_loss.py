import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sq_diff_partial_kernel(a_ptr, b_ptr, partial_ptr, n_elements, BLOCK: tl.constexpr):
    # Grid-stride loop: program p sums (a - b)^2 over blocks p, p + P, p + 2P, ...
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(pid.to(tl.int64) * BLOCK, n_elements, nprog.to(tl.int64) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n_elements
        a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        d = a - b
        acc += d * d
    tl.store(partial_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def finish_mean_kernel(partial_ptr, out_ptr, n_partials, n_elements, BLOCK: tl.constexpr):
    # A single program adds the partial sums in a fixed order: the result is deterministic.
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_partials, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(partial_ptr + offs, mask=offs < n_partials, other=0.0)
    tl.store(out_ptr, (tl.sum(acc, axis=0) / n_elements).to(out_ptr.dtype.element_ty))


def mse_loss(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    assert a.shape == b.shape and a.dtype == b.dtype, "mse_loss: shapes and dtypes must match"
    a = a.contiguous()
    b = b.contiguous()
    n = a.numel()
    if n == 0:
        raise ValueError("mse_loss: empty input")
    out = torch.empty((), dtype=a.dtype, device=a.device)
    if a.device.type == "cuda":
        BLOCK, max_programs = 4096, 1056  # 8 programs per SM on a 132-SM H100
    else:
        BLOCK, max_programs = 16384, 16
    n_programs = min(triton.cdiv(n, BLOCK), max_programs)
    partial = torch.empty(n_programs, dtype=torch.float32, device=a.device)
    sq_diff_partial_kernel[(n_programs,)](a, b, partial, n, BLOCK=BLOCK, num_warps=8)
    finish_mean_kernel[(1,)](partial, out, n_programs, n, BLOCK=1024, num_warps=4)
    return out


class ModelNew(nn.Module):
    """MSE loss as a two-stage deterministic reduction: per-program partial sums, then one
    program adds them and divides by the element count."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return mse_loss(predictions, targets)
