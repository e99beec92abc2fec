import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm over the last dimension followed by exact GELU, fp32."""

    def __init__(self, hidden: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.ln(x))


batch_size = 8192
hidden = 4096


def get_inputs():
    return [torch.randn(batch_size, hidden) * 3 - 1]


def get_init_inputs():
    return [hidden]


def get_smoke_init_inputs():
    return [1000]


def get_smoke_inputs():
    return [torch.randn(37, 1000) * 3 - 1]


def get_extra_inputs():
    return [[torch.randn(33, hidden)], [torch.randn(2, 50, hidden) * 3 - 1]]
