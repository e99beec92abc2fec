import torch
import torch.nn as nn


class Model(nn.Module):
    """Max reduction over one dimension (the dimension is a constructor argument)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.amax(x, dim=self.dim)


batch_size = 64
rows = 1024
cols = 1024
reduce_dim = 1


def get_inputs():
    return [torch.randn(batch_size, rows, cols)]


def get_init_inputs():
    return [reduce_dim]


def get_smoke_inputs():
    return [torch.randn(3, 301, 37)]


def get_extra_inputs():
    return [[torch.randn(4, 1000, 129)], [torch.randn(2, 77, 1)], [torch.randn(1, 5000, 3)]]
