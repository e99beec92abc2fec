import torch
import torch.nn as nn


class Model(nn.Module):
    """Elementwise multiply-add in bfloat16: out = x * y + z."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return x * y + z


batch_size = 8192
dim = 4096


def _make(*shape):
    return [torch.randn(*shape, dtype=torch.bfloat16) for _ in range(3)]


def get_inputs():
    return _make(batch_size, dim)


def get_init_inputs():
    return []


def get_smoke_inputs():
    return _make(37, 1000)


def get_extra_inputs():
    return [_make(256, 1024), _make(129, 777)]
