import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def group_stats_kernel(x_ptr, mean_ptr, rstd_ptr, n_groups, group_size, eps,
                       BLOCK_G: tl.constexpr, BLOCK: tl.constexpr):
    # Statistics of BLOCK_G (sample, group) pairs per program; each group's channels are
    # contiguous in NCHW. Two passes (mean, then centred variance) for accuracy.
    groups = tl.program_id(0).to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
    g_mask = groups < n_groups
    base = groups * group_size
    acc = tl.zeros((BLOCK_G, BLOCK), dtype=tl.float32)
    for start in range(0, group_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = g_mask[:, None] & (offs < group_size)[None, :]
        acc += tl.load(x_ptr + base[:, None] + offs[None, :], mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=1) / group_size
    acc = tl.zeros((BLOCK_G, BLOCK), dtype=tl.float32)
    for start in range(0, group_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = g_mask[:, None] & (offs < group_size)[None, :]
        x = tl.load(x_ptr + base[:, None] + offs[None, :], mask=mask, other=0.0).to(tl.float32)
        d = tl.where(mask, x - mean[:, None], 0.0)
        acc += d * d
    tl.store(mean_ptr + groups, mean, mask=g_mask)
    tl.store(rstd_ptr + groups, 1.0 / tl.sqrt(tl.sum(acc, axis=1) / group_size + eps), mask=g_mask)


@triton.jit
def group_norm_silu_apply_kernel(x_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, y_ptr, n_elements,
                                 C, HW, GROUPS, BLOCK: tl.constexpr):
    # Flat elementwise pass: normalise with the group's statistics, per-channel affine, SiLU.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    plane = offs // HW  # sample * C + channel
    c = plane % C
    stat = (plane // C) * GROUPS + c // (C // GROUPS)
    mean = tl.load(mean_ptr + stat, mask=mask, other=0.0)
    rstd = tl.load(rstd_ptr + stat, mask=mask, other=0.0)
    w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + c, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    h = (x - mean) * rstd * w + b
    y = h / (1.0 + tl.exp(-h))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def group_norm_silu(x, num_groups: int, weight, bias, eps: float) -> torch.Tensor:
    B, C = x.shape[0], x.shape[1]
    assert C % num_groups == 0, "group_norm_silu: channels must divide into groups"
    x = x.contiguous()
    HW = x[0, 0].numel()
    y = torch.empty_like(x)
    if y.numel() == 0:
        return y
    group_size = (C // num_groups) * HW
    mean = torch.empty(B * num_groups, dtype=torch.float32, device=x.device)
    rstd = torch.empty(B * num_groups, dtype=torch.float32, device=x.device)
    on_gpu = x.device.type == "cuda"
    n_groups = B * num_groups
    # One group per program on the GPU; under the CPU interpreter, several groups per
    # program (fewer interpreted programs, same masked code).
    BLOCK_S = min(2048 if on_gpu else 4096, triton.next_power_of_2(group_size))
    BLOCK_G = 1 if on_gpu else max(1, 16384 // BLOCK_S)
    group_stats_kernel[(triton.cdiv(n_groups, BLOCK_G),)](x, mean, rstd, n_groups, group_size, eps,
                                                          BLOCK_G=BLOCK_G, BLOCK=BLOCK_S, num_warps=8)
    n = x.numel()
    BLOCK = 2048 if on_gpu else 16384
    group_norm_silu_apply_kernel[(triton.cdiv(n, BLOCK),)](x, mean, rstd, weight, bias, y, n,
                                                            C, HW, num_groups, BLOCK=BLOCK, num_warps=8)
    return y


class ModelNew(nn.Module):
    """GroupNorm + SiLU: a statistics kernel per (sample, group), then one fused
    normalise-affine-SiLU pass over all elements."""

    def __init__(self, num_groups: int, num_channels: int):
        super().__init__()
        self.norm = nn.GroupNorm(num_groups, num_channels, eps=1e-5)
        with torch.no_grad():  # same parameter initialisation as the reference
            self.norm.weight.copy_(1.0 + 0.1 * torch.randn(num_channels))
            self.norm.bias.copy_(0.1 * torch.randn(num_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return group_norm_silu(x, self.norm.num_groups, self.norm.weight, self.norm.bias, self.norm.eps)
