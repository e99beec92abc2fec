"""Correct ReLU that fails loudly if it can see a secret or runs outside a scratch folder."""
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

leaked = sorted(k for k, v in os.environ.items()
                if "canary" in v or "KEY" in k.upper() or "TOKEN" in k.upper() or "SECRET" in k.upper())
if leaked:
    raise RuntimeError(f"candidate saw secrets: {leaked}")
if "kernelagent-scratch" not in os.getcwd():
    raise RuntimeError(f"candidate runs in {os.getcwd()}, not a scratch directory")
if os.environ.get("HOME") != os.getcwd():
    raise RuntimeError("HOME is not the scratch directory")


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
