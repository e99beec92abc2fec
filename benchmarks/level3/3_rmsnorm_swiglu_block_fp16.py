import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Pre-norm feed-forward block in fp16: x + W_down(silu(W_gate(n)) * W_up(n)), n = RMSNorm(x).

    RMSNorm statistics are computed in fp32; all weights are fp16 and bias-free.
    """

    def __init__(self, d_model: int, d_ff: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.norm_weight = nn.Parameter(torch.ones(d_model, dtype=torch.float16))
        self.gate = nn.Linear(d_model, d_ff, bias=False).to(torch.float16)
        self.up = nn.Linear(d_model, d_ff, bias=False).to(torch.float16)
        self.down = nn.Linear(d_ff, d_model, bias=False).to(torch.float16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        n = (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)).to(x.dtype) * self.norm_weight
        h = F.silu(self.gate(n)) * self.up(n)
        return x + self.down(h)


batch_size = 4
seq_len = 2048
d_model = 1024
d_ff = 2816


def get_inputs():
    return [torch.randn(batch_size, seq_len, d_model, dtype=torch.float16)]


def get_init_inputs():
    return [d_model, d_ff]


def get_smoke_init_inputs():
    return [40, 72]


def get_smoke_inputs():
    return [torch.randn(2, 9, 40, dtype=torch.float16)]


def get_extra_inputs():
    return [[torch.randn(1, 7, d_model, dtype=torch.float16)], [torch.randn(2, 33, d_model, dtype=torch.float16)]]


def get_flops(x):
    tokens = x.numel() // x.shape[-1]
    return 2.0 * tokens * d_model * d_ff * 3
