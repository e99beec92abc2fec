"""A row softmax small enough for the CPU's interpreter (issue 24's class-1 rows)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(64, 1024)]


def get_init_inputs():
    return []


def get_smoke_inputs():
    return [torch.randn(8, 1024)]
