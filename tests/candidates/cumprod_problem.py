"""A cumulative product along the last dim of rand() inputs (as KernelBench's 90_cumprod): the
true outputs decay below any tolerance within a few dozen steps."""
import torch
import torch.nn as nn

BATCH, N = 4, 512


class Model(nn.Module):
    def forward(self, x):
        return torch.cumprod(x, dim=1)


def get_inputs():
    return [torch.rand(BATCH, N)]


def get_init_inputs():
    return []
