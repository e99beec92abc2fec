"""Honest: the same Triton layer as literal_affine_hack.py, sized from the inputs' shapes."""
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
        affine_relu_kernel[(x.shape[0], n)](x.contiguous(), self.linear.weight, self.linear.bias, y,
                                             K=x.shape[1], N=n, BK=64)
        return y
