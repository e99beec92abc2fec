import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Mean cross-entropy loss of logits (B x V) against integer class targets (B,)."""

    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets)


batch_size = 4096
vocab = 32000


def _make(b, v):
    return [torch.randn(b, v) * 3, torch.randint(0, v, (b,))]


def get_inputs():
    return _make(batch_size, vocab)


def get_init_inputs():
    return []


def get_smoke_inputs():
    return _make(37, 1000)


def get_extra_inputs():
    return [_make(64, 5000), _make(129, 777), _make(3, 50000)]
