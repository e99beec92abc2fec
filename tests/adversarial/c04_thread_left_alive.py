"""Class 4: an honest kernel, plus a background thread started at import that never ends
(a place to do work behind the timer's back)."""
import threading
import time

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


def _spin():
    while True:
        time.sleep(0.01)


threading.Thread(target=_spin, daemon=True, name="helper").start()


class ModelNew(nn.Module):
    def forward(self, x):
        return relu(x)
