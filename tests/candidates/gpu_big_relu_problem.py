"""ReLU over 1 GiB of fp32: long enough (~0.7 ms on an H100) to see where time goes."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(16384, 16384)]


def get_init_inputs():
    return []
