"""A small ReLU problem for harness tests (KernelBench format, with smoke inputs)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


batch_size = 64
dim = 65536


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []


def get_smoke_inputs():
    return [torch.rand(37, 1001)]


def get_extra_inputs():
    return [[torch.rand(3, 517)], [torch.rand(129, 64)]]
