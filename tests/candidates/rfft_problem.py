"""A real FFT along the last dim (issue 54): its outputs are complex64."""
import torch
import torch.nn as nn

ROWS, N = 4, 1000


class Model(nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, N)]


def get_init_inputs():
    return []
