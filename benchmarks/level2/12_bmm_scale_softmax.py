import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """Batched GEMM, scale, then softmax over the last dimension: softmax(scale * A[b] @ B[b]), fp32."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.softmax(torch.bmm(a, b) * self.scale, dim=-1)


batch_size = 64
M = 512
K = 128
N = 1024
scale = 1.0 / math.sqrt(K)


def _make(batch, m, k, n):
    return [torch.randn(batch, m, k), torch.randn(batch, k, n)]


def get_inputs():
    return _make(batch_size, M, K, N)


def get_init_inputs():
    return [scale]


def get_smoke_inputs():
    return _make(3, 37, 71, 53)


def get_extra_inputs():
    return [_make(2, 129, K, 257), _make(1, 1, K, 1000), _make(5, 64, K, 96)]


def get_flops(a, b):
    return 2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
