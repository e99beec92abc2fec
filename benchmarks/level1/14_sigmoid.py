import torch
import torch.nn as nn


class Model(nn.Module):
    """Elementwise logistic sigmoid: y = 1 / (1 + exp(-x))."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x)


batch_size = 4096
dim = 16384


def get_inputs():
    return [torch.randn(batch_size, dim) * 4]


def get_init_inputs():
    return []


def get_smoke_inputs():
    return [torch.randn(37, 1000) * 4]


def get_extra_inputs():
    return [[torch.randn(256, 1024) * 4], [torch.randn(129, 777) * 20], [torch.randn(5, 3, 11)]]
