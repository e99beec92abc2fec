"""Hostile (issue 11, class 3): the recording TorchDispatchMode is popped with
`_disable_current_modes()`.

How it gets through today: during each correctness check the Monitor pushes a TorchDispatchMode
that records every aten op. `torch.utils._python_dispatch._disable_current_modes()` pops every
mode on the stack for the duration of a `with` block, so the torch ReLU inside it (`x.clamp`,
not listed by the static pass) is never recorded. A do-nothing Triton launch per call supplies
the "own launch" the evidence asks for.

Its result is a cheat (torch does the work): `correct` today. Only in-process evidence can see
it on the CPU; on a GPU, a profiler session owned by the server.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch.utils._python_dispatch import _disable_current_modes


@triton.jit
def touch_kernel(p_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(p_ptr + offsets, tl.zeros((BLOCK,), tl.float32), mask=offsets < n)


class ModelNew(nn.Module):
    def forward(self, x):
        touch = torch.empty(16, device=x.device)
        touch_kernel[(1,)](touch, 16, BLOCK=16)
        with _disable_current_modes():
            return x.clamp(min=0)
