import torch
import torch.nn as nn


class Model(nn.Module):
    """2-D convolution (NCHW, fp32, square kernel, with bias)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch_size = 32
in_channels = 128
out_channels = 128
kernel_size = 3
height = 56
width = 56
stride = 1
padding = 1


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding]


def get_smoke_init_inputs():
    return [3, 5, 3, 2, 1]


def get_smoke_inputs():
    return [torch.randn(2, 3, 11, 13)]


def get_extra_inputs():
    return [[torch.randn(1, in_channels, 17, 19)], [torch.randn(2, in_channels, 28, 28)]]


def get_flops(x):
    n, _, h, w = x.shape
    oh = (h + 2 * padding - kernel_size) // stride + 1
    ow = (w + 2 * padding - kernel_size) // stride + 1
    return 2.0 * n * out_channels * oh * ow * in_channels * kernel_size * kernel_size
