import torch
import torch.nn as nn


class Model(nn.Module):
    """Linear layer, sigmoid, then a sum over the features: sum_j sigmoid(x W^T + b)[:, j], fp32."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc(x)).sum(dim=-1, keepdim=True)


batch_size = 8192
in_features = 1024
out_features = 4096


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]


def get_smoke_init_inputs():
    return [71, 300]


def get_smoke_inputs():
    return [torch.randn(37, 71)]


def get_extra_inputs():
    return [[torch.randn(1, in_features)], [torch.randn(2, 33, in_features)]]


def get_flops(x):
    return 2.0 * x.numel() * out_features
