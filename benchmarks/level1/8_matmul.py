import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """Dense fp32 matrix product C = A @ B (A: M x K, B: K x N)."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


M = 4096
K = 4096
N = 4096


def _make(m, k, n):
    # A is scaled by 1/sqrt(K) so that outputs are O(1) whatever K is.
    return [torch.randn(m, k) / math.sqrt(k), torch.randn(k, n)]


def get_inputs():
    return _make(M, K, N)


def get_init_inputs():
    return []


def get_smoke_inputs():
    return _make(37, 71, 53)


def get_extra_inputs():
    return [_make(256, 512, 384), _make(129, 300, 257), _make(1, 1000, 64)]


def get_flops(a, b):
    return 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
