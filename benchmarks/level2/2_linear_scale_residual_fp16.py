import torch
import torch.nn as nn


class Model(nn.Module):
    """fp16 linear layer, scaled, plus a residual input: out = (x @ W^T + b) * scale + residual."""

    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features).to(torch.float16)
        self.scale = scale

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale + residual


batch_size = 16384
in_features = 2048
out_features = 2048
scale = 0.5


def _make(m, k, n):
    return [torch.randn(m, k, dtype=torch.float16), torch.randn(m, n, dtype=torch.float16)]


def get_inputs():
    return _make(batch_size, in_features, out_features)


def get_init_inputs():
    return [in_features, out_features, scale]


def get_smoke_init_inputs():
    return [71, 53, scale]


def get_smoke_inputs():
    return _make(37, 71, 53)


def get_extra_inputs():
    return [_make(1, in_features, out_features), _make(77, in_features, out_features)]


def get_flops(x, residual):
    return 2.0 * x.numel() * out_features
