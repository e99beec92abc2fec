import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """CNN stage: Conv2d 3x3 (no bias) -> BatchNorm (inference form, running stats as buffers)
    -> ReLU -> MaxPool 2x2, fp32 NCHW."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.eps = 1e-5
        self.bn_weight = nn.Parameter(1.0 + 0.1 * torch.randn(out_channels))
        self.bn_bias = nn.Parameter(0.1 * torch.randn(out_channels))
        self.register_buffer("running_mean", 0.1 * torch.randn(out_channels))
        self.register_buffer("running_var", 0.5 + torch.rand(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y = F.batch_norm(y, self.running_mean, self.running_var, self.bn_weight, self.bn_bias,
                         training=False, eps=self.eps)
        return F.max_pool2d(torch.relu(y), kernel_size=2, stride=2)


batch_size = 32
in_channels = 64
out_channels = 128
height = 56
width = 56


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]


def get_smoke_init_inputs():
    return [3, 12]


def get_smoke_inputs():
    return [torch.randn(2, 3, 9, 11)]


def get_extra_inputs():
    return [[torch.randn(1, in_channels, 17, 19)], [torch.randn(2, in_channels, 24, 24)]]


def get_flops(x):
    n, _, h, w = x.shape
    return 2.0 * n * out_channels * h * w * in_channels * 9
