import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """BatchNorm2d in inference form: per-channel (x - running_mean) / sqrt(running_var + eps)
    * weight + bias, with the running statistics held as buffers."""

    def __init__(self, num_features: int):
        super().__init__()
        self.eps = 1e-5
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(num_features))
        self.bias = nn.Parameter(0.1 * torch.randn(num_features))
        self.register_buffer("running_mean", 0.5 * torch.randn(num_features))
        self.register_buffer("running_var", 0.5 + torch.rand(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            training=False, eps=self.eps)


batch_size = 32
channels = 256
height = 56
width = 56


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels]


def get_smoke_inputs():
    return [torch.randn(2, channels, 5, 7)]


def get_extra_inputs():
    return [[torch.randn(1, channels, 17, 19)], [torch.randn(3, channels, 7, 7)]]
