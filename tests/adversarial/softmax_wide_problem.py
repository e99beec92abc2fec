"""Softmax over rows of ~400k columns: outputs near 2.5e-6, well under atol=1e-4. The smoke
inputs keep that property."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(64, 400_000)]


def get_init_inputs():
    return []


def get_smoke_inputs():
    return [torch.randn(2, 400_000)]
