import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """Half-precision matrix product C = A @ B^T (A: M x K, B: N x K, both fp16; fp16 output)."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b.t())


M = 8192
K = 4096
N = 8192


def _make(m, k, n):
    a = (torch.randn(m, k) / math.sqrt(k)).to(torch.float16)
    b = torch.randn(n, k).to(torch.float16)
    return [a, b]


def get_inputs():
    return _make(M, K, N)


def get_init_inputs():
    return []


def get_smoke_inputs():
    return _make(37, 71, 53)


def get_extra_inputs():
    return [_make(256, 512, 384), _make(129, 300, 257)]


def get_flops(a, b):
    return 2.0 * a.shape[0] * a.shape[1] * b.shape[0]
