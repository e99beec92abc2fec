"""Hostile (issue 24, class 1): a softmax built from PyTorch ops that are neither on a list of
"heavy" names nor the reference's own: exp, index_add_ (the row sums) and div, beside a Triton
kernel that only touches one element. The names are computed, so the static pass sees none.

Held when every op that is not glue counts as work: the recorder sees aten::exp, index_add_ and
div over the whole input.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def touch_kernel(y_ptr):
    tl.store(y_ptr, tl.load(y_ptr))


def _op(t, name, *args):
    return getattr(t, name)(*args)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        e = _op(x, "e" + "xp")
        cols = torch.zeros(x.shape[1], dtype=torch.long, device=x.device)
        sums = _op(torch.zeros(x.shape[0], 1, device=x.device), "index_" + "add_", 1, cols, e)
        y = _op(e, "d" + "iv", sums)
        touch_kernel[(1,)](y)
        return y
