import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """Matrix-vector product y = A @ x (A: M x K, x: K x 1), fp32."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, x)


M = 16384
K = 8192


def _make(m, k):
    return [torch.randn(m, k) / math.sqrt(k), torch.randn(k, 1)]


def get_inputs():
    return _make(M, K)


def get_init_inputs():
    return []


def get_smoke_inputs():
    return _make(37, 1001)


def get_extra_inputs():
    return [_make(256, 4096), _make(129, 777), _make(1, 20000), _make(3000, 5)]


def get_flops(a, x):
    return 2.0 * a.shape[0] * a.shape[1]
