import torch
import torch.nn as nn


class Model(nn.Module):
    """One GRU cell step built from two linear layers (PyTorch's gate order r, z, n), fp32:
    r = sigmoid(xr + hr), z = sigmoid(xz + hz), n = tanh(xn + r * hn), h' = (1 - z) * n + z * h,
    where [xr, xz, xn] = x W_ih^T + b_ih and [hr, hz, hn] = h W_hh^T + b_hh."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.x2h = nn.Linear(input_size, 3 * hidden_size)
        self.h2h = nn.Linear(hidden_size, 3 * hidden_size)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        xr, xz, xn = self.x2h(x).chunk(3, dim=-1)
        hr, hz, hn = self.h2h(h).chunk(3, dim=-1)
        r = torch.sigmoid(xr + hr)
        z = torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)
        return (1.0 - z) * n + z * h


batch_size = 4096
input_size = 1024
hidden_size = 1024


def _make(batch, inp, hid):
    return [torch.randn(batch, inp), torch.randn(batch, hid)]


def get_inputs():
    return _make(batch_size, input_size, hidden_size)


def get_init_inputs():
    return [input_size, hidden_size]


def get_smoke_init_inputs():
    return [71, 53]


def get_smoke_inputs():
    return _make(37, 71, 53)


def get_extra_inputs():
    return [_make(1, input_size, hidden_size), _make(129, input_size, hidden_size)]


def get_flops(x, h):
    hid = h.shape[-1]
    return 2.0 * x.shape[0] * 3 * hid * (x.shape[1] + hid)
