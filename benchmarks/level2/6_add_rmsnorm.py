import torch
import torch.nn as nn


class Model(nn.Module):
    """Residual add followed by RMSNorm: y = rmsnorm(x + residual) * weight, fp32."""

    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = x + residual
        return h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


batch_size = 8192
hidden = 4096


def _make(*shape):
    return [torch.randn(*shape), torch.randn(*shape)]


def get_inputs():
    return _make(batch_size, hidden)


def get_init_inputs():
    return [hidden]


def get_smoke_init_inputs():
    return [1000]


def get_smoke_inputs():
    return _make(37, 1000)


def get_extra_inputs():
    return [_make(64, hidden), _make(3, 43, hidden)]
