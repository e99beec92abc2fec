"""Hostile (issue 24, class 6): correct at the problem's one literal shape only. It computes the
layer with a Triton kernel whose grid and row count are baked in for a batch of 64 (the literal
in get_inputs), so any other batch gets rows left unwritten."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def affine_relu_kernel(x_ptr, w_ptr, b_ptr, y_ptr, K: tl.constexpr, N: tl.constexpr, BK: tl.constexpr):
    row = tl.program_id(0)
    col = tl.program_id(1)
    offs = tl.arange(0, BK)
    acc = tl.zeros([BK], dtype=tl.float32)
    for k in range(0, K, BK):
        mask = k + offs < K
        acc += tl.load(x_ptr + row * K + k + offs, mask=mask, other=0.0) * \
            tl.load(w_ptr + col * K + k + offs, mask=mask, other=0.0)
    out = tl.sum(acc, axis=0) + tl.load(b_ptr + col)
    tl.store(y_ptr + row * N + col, tl.maximum(out, 0.0))


class ModelNew(nn.Module):
    def __init__(self, out_features):
        super().__init__()
        self.linear = nn.Linear(40, out_features)

    def forward(self, x):
        n = self.linear.weight.shape[0]
        y = torch.zeros(x.shape[0], n, device=x.device, dtype=x.dtype)
        affine_relu_kernel[(64, n)](x.contiguous(), self.linear.weight, self.linear.bias, y, K=40, N=n, BK=64)
        return y
