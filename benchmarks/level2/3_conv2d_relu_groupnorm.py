import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d (3x3, padding 1, bias) -> ReLU -> GroupNorm, fp32 NCHW."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, num_groups: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.norm = nn.GroupNorm(num_groups, out_channels, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.relu(self.conv(x)))


batch_size = 16
in_channels = 64
out_channels = 128
kernel_size = 3
num_groups = 8
height = 64
width = 64


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups]


def get_smoke_init_inputs():
    return [3, 12, 3, 4]


def get_smoke_inputs():
    return [torch.randn(2, 3, 9, 11)]


def get_extra_inputs():
    return [[torch.randn(1, in_channels, 17, 19)], [torch.randn(2, in_channels, 24, 24)]]


def get_flops(x):
    n, _, h, w = x.shape
    return 2.0 * n * out_channels * h * w * in_channels * kernel_size * kernel_size
