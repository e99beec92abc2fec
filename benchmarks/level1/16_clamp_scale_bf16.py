import torch
import torch.nn as nn


class Model(nn.Module):
    """Clamp to [min_val, max_val], then scale, in bfloat16: y = clamp(x, lo, hi) * scale."""

    def __init__(self, min_val: float, max_val: float, scale: float):
        super().__init__()
        self.min_val = min_val
        self.max_val = max_val
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, self.min_val, self.max_val) * self.scale


batch_size = 8192
dim = 8192
min_val = -1.5
max_val = 2.0
scale = 1.7


def _make(*shape):
    return [torch.randn(*shape, dtype=torch.bfloat16) * 2]


def get_inputs():
    return _make(batch_size, dim)


def get_init_inputs():
    return [min_val, max_val, scale]


def get_smoke_inputs():
    return _make(37, 1000)


def get_extra_inputs():
    return [_make(256, 1024), _make(129, 777), _make(3, 5, 7)]
