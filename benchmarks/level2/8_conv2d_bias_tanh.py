import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d (3x3, padding 1, no conv bias) + a separate per-channel bias, then tanh, fp32 NCHW."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False)
        self.bias = nn.Parameter(0.1 * torch.randn(out_channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv(x) + self.bias)


batch_size = 16
in_channels = 64
out_channels = 128
kernel_size = 3
height = 64
width = 64


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]


def get_smoke_init_inputs():
    return [3, 12, 3]


def get_smoke_inputs():
    return [torch.randn(2, 3, 9, 11)]


def get_extra_inputs():
    return [[torch.randn(1, in_channels, 17, 19)], [torch.randn(2, in_channels, 24, 24)]]


def get_flops(x):
    n, _, h, w = x.shape
    return 2.0 * n * out_channels * h * w * in_channels * kernel_size * kernel_size
