import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Elementwise LeakyReLU: y = x if x >= 0 else negative_slope * x."""

    def __init__(self, negative_slope: float):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x, negative_slope=self.negative_slope)


batch_size = 4096
dim = 16384
negative_slope = 0.01


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [negative_slope]


def get_smoke_inputs():
    return [torch.randn(37, 1000)]


def get_extra_inputs():
    return [[torch.randn(256, 1024)], [torch.randn(129, 777)], [torch.randn(2, 3, 5, 7)]]
