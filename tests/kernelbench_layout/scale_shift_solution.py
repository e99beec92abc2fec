import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scale_shift_kernel(x_ptr, w_ptr, y_ptr, n_rows, n_cols, shift, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask)
    w = tl.load(w_ptr + cols, mask=mask)
    tl.store(y_ptr + row * n_cols + cols, x * w + shift, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, features, shift):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))  # same RNG draw as Model
        self.shift = shift

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        rows, cols = x.shape
        scale_shift_kernel[(rows, triton.cdiv(cols, 1024))](x, self.weight, y, rows, cols, self.shift, BLOCK=1024)
        return y
