"""A KernelBench-style problem whose get_inputs() writes its shapes as literals (issue 24,
class 6): no module-level size constant to derive check sets from."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, out_features):
        super().__init__()
        self.linear = nn.Linear(40, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(64, 40)]


def get_init_inputs():
    return [4]
