import torch
import torch.nn as nn


class Model(nn.Module):
    """Index of the maximum along the last dimension (int64 output, first index on ties)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.argmax(x, dim=-1)


batch_size = 4096
dim = 16384


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []


def get_smoke_inputs():
    return [torch.randn(37, 1000)]


def get_extra_inputs():
    return [[torch.randn(64, 4096)], [torch.randn(3, 43, 777)], [torch.randn(2, 9000)], [torch.randn(5, 1)]]
