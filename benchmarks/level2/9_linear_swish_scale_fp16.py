import torch
import torch.nn as nn


class Model(nn.Module):
    """Linear layer, swish (x * sigmoid(x)), then a constant scale, all in fp16."""

    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features).to(torch.float16)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y * torch.sigmoid(y) * self.scale


batch_size = 8192
in_features = 2048
out_features = 8192
scale = 1.5


def get_inputs():
    return [torch.randn(batch_size, in_features, dtype=torch.float16)]


def get_init_inputs():
    return [in_features, out_features, scale]


def get_smoke_init_inputs():
    return [71, 53, scale]


def get_smoke_inputs():
    return [torch.randn(37, 71, dtype=torch.float16)]


def get_extra_inputs():
    return [[torch.randn(1, in_features, dtype=torch.float16)],
            [torch.randn(2, 33, in_features, dtype=torch.float16)]]


def get_flops(x):
    return 2.0 * x.numel() * out_features
