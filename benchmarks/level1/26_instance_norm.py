import torch
import torch.nn as nn


class Model(nn.Module):
    """InstanceNorm2d with a learnable per-channel affine (statistics per sample and channel)."""

    def __init__(self, num_features: int):
        super().__init__()
        self.norm = nn.InstanceNorm2d(num_features, eps=1e-5, affine=True)
        with torch.no_grad():  # non-trivial affine parameters
            self.norm.weight.copy_(1.0 + 0.1 * torch.randn(num_features))
            self.norm.bias.copy_(0.1 * torch.randn(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


batch_size = 32
channels = 64
height = 128
width = 128


def get_inputs():
    return [torch.randn(batch_size, channels, height, width) * 2 + 0.5]


def get_init_inputs():
    return [channels]


def get_smoke_inputs():
    return [torch.randn(2, channels, 11, 13) * 2 + 0.5]


def get_extra_inputs():
    return [[torch.randn(1, channels, 17, 19)], [torch.randn(3, channels, 32, 32) * 2 + 0.5]]
