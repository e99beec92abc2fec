import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """GroupNorm followed by SiLU (the diffusion U-Net normalisation), fp32 NCHW."""

    def __init__(self, num_groups: int, num_channels: int):
        super().__init__()
        self.norm = nn.GroupNorm(num_groups, num_channels, eps=1e-5)
        with torch.no_grad():  # non-trivial affine parameters
            self.norm.weight.copy_(1.0 + 0.1 * torch.randn(num_channels))
            self.norm.bias.copy_(0.1 * torch.randn(num_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.norm(x))


batch_size = 16
channels = 256
num_groups = 32
height = 64
width = 64


def get_inputs():
    return [torch.randn(batch_size, channels, height, width) * 2 + 0.5]


def get_init_inputs():
    return [num_groups, channels]


def get_smoke_inputs():
    return [torch.randn(2, channels, 9, 11) * 2 + 0.5]


def get_extra_inputs():
    return [[torch.randn(1, channels, 17, 19)], [torch.randn(2, channels, 8, 8) * 2 + 0.5]]
