import torch
import torch.nn as nn


class Model(nn.Module):
    """Attention-score post-processing in bf16: softmax(causal_mask(scores * scale)) over the last dim.

    scores has shape (batch, heads, seq, seq); entries above the diagonal are masked out.
    """

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        s = scores * self.scale
        seq_q, seq_k = s.shape[-2], s.shape[-1]
        future = torch.ones(seq_q, seq_k, dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
        return torch.softmax(s, dim=-1)


batch_size = 4
heads = 16
seq_len = 2048
scale = 0.125


def get_inputs():
    return [torch.randn(batch_size, heads, seq_len, seq_len, dtype=torch.bfloat16) * 8]


def get_init_inputs():
    return [scale]


def get_smoke_inputs():
    return [torch.randn(2, 3, 37, 37, dtype=torch.bfloat16) * 8]


def get_extra_inputs():
    return [[torch.randn(1, 2, 129, 129, dtype=torch.bfloat16) * 8],
            [torch.randn(2, 2, 256, 256, dtype=torch.bfloat16) * 8]]
