import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Pre-norm GEGLU feed-forward block with a residual, fp32:
    y = x + down(gelu(gate(n)) * up(n)), n = LayerNorm(x); the projections have no bias."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=1e-5)
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.norm(x)
        return x + self.down(F.gelu(self.gate(n)) * self.up(n))


batch_size = 4
seq_len = 1024
d_model = 1024
d_ff = 2816


def get_inputs():
    return [torch.randn(batch_size, seq_len, d_model)]


def get_init_inputs():
    return [d_model, d_ff]


def get_smoke_init_inputs():
    return [48, 80]


def get_smoke_inputs():
    return [torch.randn(2, 37, 48)]


def get_extra_inputs():
    return [[torch.randn(1, 77, d_model)], [torch.randn(2, 64, d_model)]]


def get_flops(x):
    tokens = x.numel() // d_model
    return 2.0 * tokens * d_model * d_ff * 3
