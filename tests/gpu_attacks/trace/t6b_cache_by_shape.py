"""Trace attack 6b (issue 55): one launch serving several timed calls (cached by shape only).

The first output of each shape is remembered and returned for every later input of that shape,
stale: the later calls launch nothing. Outputs are wrong for any new data of a seen shape.
Should be caught by: the checks (a stale, wrong output for fresh inputs); were the checks passed,
the trace's idle-call / launch-mismatch (the timed calls launch no kernel)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


def relu(x, y, n):
    relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    return y


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = {}

    def forward(self, x):
        key = tuple(x.shape)
        if key not in self.cache:
            x = x.contiguous()
            self.cache[key] = relu(x, torch.empty_like(x), x.numel())
        return self.cache[key]
