import torch
import torch.nn as nn


class Model(nn.Module):
    """Row-wise log-softmax over the last dimension."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=-1)


batch_size = 8192
dim = 8192


def get_inputs():
    return [torch.randn(batch_size, dim) * 3]


def get_init_inputs():
    return []


def get_smoke_inputs():
    return [torch.randn(37, 1000) * 3]


def get_extra_inputs():
    return [[torch.randn(64, 4096) * 3], [torch.randn(3, 43, 777)], [torch.randn(2, 40000) * 3]]
