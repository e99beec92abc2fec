"""Multiply by a constant (KernelBench format) with small inputs: a CI manifest fixture."""
import torch
import torch.nn as nn

FACTOR = 2.5


class Model(nn.Module):
    def forward(self, x):
        return x * FACTOR


def get_inputs():
    return [torch.randn(64, 4096)]


def get_init_inputs():
    return []


def get_smoke_inputs():
    return [torch.randn(16, 257)]
