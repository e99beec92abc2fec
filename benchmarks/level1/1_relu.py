import torch
import torch.nn as nn


class Model(nn.Module):
    """Elementwise ReLU: y = max(x, 0)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


batch_size = 4096
dim = 16384


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []


def get_smoke_inputs():
    return [torch.randn(37, 1000)]


def get_extra_inputs():
    return [[torch.randn(256, 1024)], [torch.randn(129, 777)], [torch.randn(5, 3, 11)]]
