"""Raises while being imported."""
import torch.nn as nn

SCALE = 1 / 0


class ModelNew(nn.Module):
    def forward(self, x):
        return x
