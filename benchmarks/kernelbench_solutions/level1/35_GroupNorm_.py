"""KernelBench level1/35_GroupNorm_: nn.GroupNorm (with its affine weight and bias) in Triton.

A stats pass (partial shifted sums of each (sample, group), split over several programs when
groups are few and long) and an apply pass over every element with the per-channel affine
folded into one multiply-add. Any N, C, groups and spatial size.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

_BLOCK = 4096
_MAX_SPLIT = 64


@triton.jit
def _stats_kernel(x_ptr, part_ptr, L, chunk, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    # Partial sums of one slice of one group, shifted by the group's first element so that
    # var = E[(x-k)^2] - E[x-k]^2 does not cancel when the mean is large against the spread.
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    base = x_ptr + row * L
    shift = tl.load(base).to(tl.float32)
    lo = split.to(tl.int64) * chunk
    s1 = tl.zeros((BLOCK,), dtype=tl.float32)
    s2 = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, chunk, BLOCK):
        offs = lo + start + tl.arange(0, BLOCK)
        mask = offs < L
        d = tl.where(mask, tl.load(base + offs, mask=mask, other=0.0).to(tl.float32) - shift, 0.0)
        s1 += d
        s2 += d * d
    out = part_ptr + (row * SPLIT + split) * 2
    tl.store(out, tl.sum(s1, axis=0))
    tl.store(out + 1, tl.sum(s2, axis=0))


@triton.jit
def _apply_kernel(x_ptr, y_ptr, part_ptr, w_ptr, b_ptr, C, S, L, channels_per_group, eps,
                  HAS_AFFINE: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    # One (sample, channel) plane of S elements, one BLOCK of it per program.
    nc = tl.program_id(0).to(tl.int64)
    n = nc // C
    c = nc % C
    groups = C // channels_per_group
    row = n * groups + c // channels_per_group
    k = tl.arange(0, SPLIT)
    s1 = tl.sum(tl.load(part_ptr + (row * SPLIT + k) * 2), axis=0)
    s2 = tl.sum(tl.load(part_ptr + (row * SPLIT + k) * 2 + 1), axis=0)
    shift = tl.load(x_ptr + row * L).to(tl.float32)
    mean_d = s1 / L
    var = tl.maximum(s2 / L - mean_d * mean_d, 0.0)
    rstd = 1.0 / tl.sqrt(var + eps)
    mean = shift + mean_d
    if HAS_AFFINE:
        scale = rstd * tl.load(w_ptr + c).to(tl.float32)
        bias = tl.load(b_ptr + c).to(tl.float32) - mean * scale
    else:
        scale = rstd
        bias = -mean * rstd
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < S
    x = tl.load(x_ptr + nc * S + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + nc * S + offs, (x * scale + bias).to(y_ptr.dtype.element_ty), mask=mask)


def group_norm(x: torch.Tensor, groups: int, weight, bias, eps: float) -> torch.Tensor:
    """Normalise x (N, C, *) over each group of C // groups channels and all spatial dims."""
    xc = x.contiguous()
    N, C = xc.shape[0], xc.shape[1]
    S = xc[0, 0].numel()
    L = (C // groups) * S  # elements of one group (contiguous)
    y = torch.empty_like(xc)
    if y.numel() == 0:
        return y
    rows = N * groups
    # Enough programs for the stats pass to fill the GPU even with few, long groups.
    split = 1
    while split < _MAX_SPLIT and rows * split < 1024 and L > split * _BLOCK * 4:
        split *= 2
    chunk = triton.cdiv(triton.cdiv(L, split), _BLOCK) * _BLOCK
    part = torch.empty((rows, split, 2), dtype=torch.float32, device=x.device)
    _stats_kernel[(rows, split)](xc, part, L, chunk, SPLIT=split, BLOCK=_BLOCK, num_warps=8)
    affine = weight is not None
    _apply_kernel[(N * C, triton.cdiv(S, _BLOCK))](
        xc, y, part, weight if affine else xc, bias if affine else xc, C, S, L, C // groups, eps,
        HAS_AFFINE=affine, SPLIT=split, BLOCK=_BLOCK, num_warps=8)
    return y


class ModelNew(nn.Module):
    def __init__(self, num_features: int, num_groups: int):
        super().__init__()
        self.num_groups = num_groups
        self.eps = 1e-5
        # Same parameters as nn.GroupNorm's (ones and zeros), under the same names.
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
