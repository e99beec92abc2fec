import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """Causal multi-head self-attention block in fp16 (GPT style, no dropout):
    q, k, v = separate bias-free projections; per head softmax(mask(q k^T / sqrt(d_head))) v;
    then an output projection with bias."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        assert d_model % n_heads == 0
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q = nn.Linear(d_model, d_model, bias=False).to(torch.float16)
        self.k = nn.Linear(d_model, d_model, bias=False).to(torch.float16)
        self.v = nn.Linear(d_model, d_model, bias=False).to(torch.float16)
        self.proj = nn.Linear(d_model, d_model).to(torch.float16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q = self.q(x).view(b, s, self.n_heads, self.d_head).transpose(1, 2)
        k = self.k(x).view(b, s, self.n_heads, self.d_head).transpose(1, 2)
        v = self.v(x).view(b, s, self.n_heads, self.d_head).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d_head))
        future = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        att = torch.softmax(att.masked_fill(future, float("-inf")), dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, s, d)
        return self.proj(y)


batch_size = 8
seq_len = 1024
d_model = 1024
n_heads = 16


def get_inputs():
    return [torch.randn(batch_size, seq_len, d_model, dtype=torch.float16)]


def get_init_inputs():
    return [d_model, n_heads]


def get_smoke_init_inputs():
    return [48, 4]


def get_smoke_inputs():
    return [torch.randn(2, 37, 48, dtype=torch.float16)]


def get_extra_inputs():
    return [[torch.randn(1, 77, d_model, dtype=torch.float16)],
            [torch.randn(2, 64, d_model, dtype=torch.float16)]]


def get_flops(x):
    b, s, d = x.shape
    proj = 2.0 * b * s * d * (4 * d)
    attention = 2.0 * b * s * s * d  # causal: half of the 4*b*s*s*d of full attention
    return proj + attention
