import torch
import torch.nn as nn


class Model(nn.Module):
    """Transformer-style MLP: Linear(d, h) -> exact GELU -> Linear(h, d), fp32."""

    def __init__(self, d_model: int, d_hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


batch_size = 8
seq_len = 1024
d_model = 1024
d_hidden = 4096


def get_inputs():
    return [torch.randn(batch_size, seq_len, d_model)]


def get_init_inputs():
    return [d_model, d_hidden]


def get_smoke_init_inputs():
    return [50, 130]


def get_smoke_inputs():
    return [torch.randn(2, 19, 50)]


def get_extra_inputs():
    return [[torch.randn(1, 1, d_model)], [torch.randn(3, 25, d_model)]]


def get_flops(x):
    tokens = x.numel() // x.shape[-1]
    return 2.0 * tokens * d_model * d_hidden * 2
