"""A shape-specialised ReLU for KernelBench's level1/19_ReLU: the shape of its first call is
baked in, and any other shape fails its assert (an ordinary exception, not a crash). Correct on
the main shape; the derived check sets must flag it (shape-specialisation)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _relu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.shape = None

    def forward(self, x):
        if self.shape is None:
            self.shape = tuple(x.shape)  # "compiled" for the first shape seen
        assert tuple(x.shape) == self.shape, f"kernel built for {self.shape}, got {tuple(x.shape)}"
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        _relu[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
        return y
