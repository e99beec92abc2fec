import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """Batched fp32 matrix product C[b] = A[b] @ B[b] (A: batch x M x K, B: batch x K x N)."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


batch_size = 64
M = 512
K = 1024
N = 768


def _make(batch, m, k, n):
    # A is scaled by 1/sqrt(K) so that outputs are O(1) whatever K is.
    return [torch.randn(batch, m, k) / math.sqrt(k), torch.randn(batch, k, n)]


def get_inputs():
    return _make(batch_size, M, K, N)


def get_init_inputs():
    return []


def get_smoke_inputs():
    return _make(3, 37, 71, 53)


def get_extra_inputs():
    return [_make(2, 129, 300, 257), _make(1, 1, 1000, 64), _make(5, 64, 128, 96)]


def get_flops(a, b):
    return 2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
