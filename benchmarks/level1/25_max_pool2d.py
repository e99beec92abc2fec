import torch
import torch.nn as nn


class Model(nn.Module):
    """2-D max pooling (square window, implicit -inf padding), fp32 NCHW."""

    def __init__(self, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.pool = nn.MaxPool2d(kernel_size, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


batch_size = 32
channels = 128
height = 112
width = 112
kernel_size = 3
stride = 2
padding = 1


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [kernel_size, stride, padding]


def get_smoke_inputs():
    return [torch.randn(2, 5, 11, 13)]


def get_extra_inputs():
    return [[torch.randn(1, 3, 17, 19)], [torch.randn(2, 16, 28, 28)], [torch.randn(1, 1, 2, 9)]]
