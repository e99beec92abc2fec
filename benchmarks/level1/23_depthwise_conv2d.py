import torch
import torch.nn as nn


class Model(nn.Module):
    """Depthwise 2-D convolution (groups = channels, square kernel, with bias), fp32 NCHW."""

    def __init__(self, channels: int, kernel_size: int, stride: int = 1, padding: int = 0):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, stride=stride, padding=padding,
                              groups=channels, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch_size = 16
channels = 128
height = 112
width = 112
kernel_size = 3
stride = 1
padding = 1


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, kernel_size, stride, padding]


def get_smoke_inputs():
    return [torch.randn(2, channels, 11, 13)]


def get_extra_inputs():
    return [[torch.randn(1, channels, 17, 19)], [torch.randn(2, channels, 28, 28)]]


def get_flops(x):
    n, c, h, w = x.shape
    oh = (h + 2 * padding - kernel_size) // stride + 1
    ow = (w + 2 * padding - kernel_size) // stride + 1
    return 2.0 * n * c * oh * ow * kernel_size * kernel_size
