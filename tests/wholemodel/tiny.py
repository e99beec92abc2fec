"""A tiny model for the whole-model CLI tests: a LayerNorm, then a linear layer (two regions)."""
import torch
import torch.nn as nn

batch, dim = 8, 32


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return self.fc(self.ln(x))


def get_inputs():
    return [torch.randn(batch, dim)]


def get_init_inputs():
    return [dim]
