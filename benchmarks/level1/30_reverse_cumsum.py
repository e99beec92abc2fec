import torch
import torch.nn as nn


class Model(nn.Module):
    """Reverse (suffix) inclusive sum along a dimension: y[..., i] = sum_{j >= i} x[..., j]."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x.flip(self.dim), dim=self.dim).flip(self.dim)


batch_size = 8192
length = 4096
scan_dim = 1


def get_inputs():
    # Non-negative inputs keep the suffix sums away from zero (see level1/12_cumsum).
    return [torch.rand(batch_size, length)]


def get_init_inputs():
    return [scan_dim]


def get_smoke_inputs():
    return [torch.rand(37, 1000)]


def get_extra_inputs():
    return [[torch.rand(64, 4096)], [torch.rand(129, 777)], [torch.rand(2, 9000)]]
