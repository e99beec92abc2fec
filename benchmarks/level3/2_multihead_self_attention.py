import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """Multi-head self-attention block (no mask, no dropout), fp32.

    qkv = x @ Wqkv^T + b; per head softmax(q k^T / sqrt(d_head)) v; then output projection.
    """

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        assert d_model % n_heads == 0
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = self.qkv(x).view(b, s, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d_head))
        att = torch.softmax(att, dim=-1)
        y = torch.matmul(att, v)
        y = y.transpose(1, 2).reshape(b, s, d)
        return self.proj(y)


batch_size = 8
seq_len = 1024
d_model = 1024
n_heads = 16


def get_inputs():
    return [torch.randn(batch_size, seq_len, d_model)]


def get_init_inputs():
    return [d_model, n_heads]


def get_smoke_init_inputs():
    return [48, 4]


def get_smoke_inputs():
    return [torch.randn(2, 37, 48)]


def get_extra_inputs():
    return [[torch.randn(1, 77, d_model)], [torch.randn(2, 64, d_model)]]


def get_flops(x):
    b, s, d = x.shape
    proj = 2.0 * b * s * d * (3 * d) + 2.0 * b * s * d * d
    attention = 4.0 * b * s * s * d
    return proj + attention
