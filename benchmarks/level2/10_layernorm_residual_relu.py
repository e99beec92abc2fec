import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm over the last dimension, plus a residual, then ReLU: relu(LN(x) + r), fp32."""

    def __init__(self, hidden: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden, eps=1e-5)
        with torch.no_grad():  # non-trivial affine parameters
            self.ln.weight.copy_(1.0 + 0.1 * torch.randn(hidden))
            self.ln.bias.copy_(0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.ln(x) + residual)


batch_size = 8192
hidden = 4096


def _make(*shape):
    return [torch.randn(*shape) * 2 + 0.5, torch.randn(*shape)]


def get_inputs():
    return _make(batch_size, hidden)


def get_init_inputs():
    return [hidden]


def get_smoke_inputs():
    return _make(37, hidden)


def get_extra_inputs():
    return [_make(64, hidden), _make(3, 43, hidden)]
