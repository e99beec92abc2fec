import torch
import torch.nn as nn


class Model(nn.Module):
    """Elementwise exact (erf-based) GELU: y = 0.5 * x * (1 + erf(x / sqrt(2)))."""

    def __init__(self):
        super().__init__()
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x)


batch_size = 4096
dim = 8192


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []


def get_smoke_inputs():
    return [torch.randn(37, 1000) * 3]


def get_extra_inputs():
    return [[torch.randn(64, 1024) * 3], [torch.randn(129, 777)]]
