"""Class 5: the harness's own pre-bound clock and event timer replaced."""
import kernelagent.harness.child.timing as timing

import torch
import torch.nn as nn
import triton
import triton.language as tl

@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


def relu(x):
    y = torch.empty_like(x)
    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y

timing._perf_counter = lambda: 0.0
timing._event_elapsed = lambda start, end: 1e-6


class ModelNew(nn.Module):
    def forward(self, x):
        return relu(x)
