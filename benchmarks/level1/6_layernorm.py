import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm over the last dimension, with learnable weight and bias."""

    def __init__(self, normalized_shape: int):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


batch_size = 8192
hidden = 4096


def get_inputs():
    return [torch.randn(batch_size, hidden) * 2 + 0.5]


def get_init_inputs():
    return [hidden]


def get_smoke_init_inputs():
    return [1000]


def get_smoke_inputs():
    return [torch.randn(37, 1000) * 2 + 0.5]


def get_extra_inputs():
    return [[torch.randn(64, hidden)], [torch.randn(3, 43, hidden) * 2 + 0.5]]
