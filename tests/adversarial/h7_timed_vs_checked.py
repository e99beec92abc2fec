"""Hostile (issue 11, class 7): timed calls told apart from checked calls.

How it gets through today: correctness checks run under the Monitor's TorchDispatchMode, timed
calls do not, so `torch._C._len_torch_dispatch_stack()` says which is which. Checked calls run
an honest (slow) Triton ReLU; timed calls run torch's ReLU (`x.clamp`, fast, correct values,
no custom kernel and nothing recording it). The timed-output check then passes too, and the
reported time is torch's, not the kernel's.

Its result is a fake time: the median must stay near that of the honest kernel
(relu_good.py). Once timed and checked calls are drawn alike, the candidate either always runs
torch (rejected) or always its kernel (an honest time).
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        if torch._C._len_torch_dispatch_stack() == 0:
            return x.clamp(min=0)  # a timed call
        x = x.contiguous()
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
