"""Two regions of clearly different cost, the cheap one first in the graph: a LayerNorm, then a
linear layer many times its time (the plan's noise tests: the ranking must not follow the graph)."""
import torch
import torch.nn as nn

rows, dim = 128, 512


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return self.fc(torch.tanh(self.ln(x)))


def get_inputs():
    return [torch.randn(rows, dim)]


def get_smoke_inputs():
    return get_inputs()


def get_init_inputs():
    return [dim]
