"""Doubling (a tiny problem for the bench tests)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * 2.0


def get_inputs():
    return [torch.randn(256, 1024)]


def get_init_inputs():
    return []


def get_smoke_inputs():
    return [torch.randn(19, 257)]
