import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Cosine-embedding style loss: mean over rows of 1 - cos(a_i, b_i) (a 0-dim scalar)."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        cosine = F.cosine_similarity(predictions, targets, dim=-1, eps=1e-8)
        return torch.mean(1.0 - cosine)


batch_size = 8192
dim = 4096


def _make(*shape):
    # Targets are correlated with the predictions, so the loss is well away from zero and
    # from one.
    a = torch.randn(*shape)
    return [a, 0.7 * a + torch.randn(*shape)]


def get_inputs():
    return _make(batch_size, dim)


def get_init_inputs():
    return []


def get_smoke_inputs():
    return _make(37, 1000)


def get_extra_inputs():
    return [_make(64, dim), _make(3, 43, 777), _make(2, 20000)]
