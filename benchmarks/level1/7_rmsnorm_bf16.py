import torch
import torch.nn as nn


class Model(nn.Module):
    """RMSNorm over the last dimension of a bfloat16 tensor (statistics in fp32), fp32 weight."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        inv_rms = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (xf * inv_rms * self.weight).to(x.dtype)


batch_size = 8192
hidden = 4096


def get_inputs():
    return [torch.randn(batch_size, hidden, dtype=torch.bfloat16)]


def get_init_inputs():
    return [hidden]


def get_smoke_init_inputs():
    return [1000]


def get_smoke_inputs():
    return [torch.randn(37, 1000, dtype=torch.bfloat16)]


def get_extra_inputs():
    return [[torch.randn(64, hidden, dtype=torch.bfloat16)], [torch.randn(3, 43, hidden, dtype=torch.bfloat16)]]
