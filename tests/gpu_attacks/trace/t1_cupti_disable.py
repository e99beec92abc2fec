"""Trace attack 1 (issue 55): CUPTI switched off through ctypes around PyTorch work.

libcupti is found among the process's loaded libraries (/proc/self/maps) and
cuptiActivityDisable(CONCURRENT_KERNEL) / (KERNEL) is called around a torch computation inside
forward (synchronised both sides, so the harness's markers stay traced; the torch op is reached
through getattr, past the static pass); its own Triton kernel does a sliver of the output. Outputs
are correct.
Should be caught by: the trace's untraced-work (the traced busy time of a timed call far below
the server's clock), hidden-work (the sliver is under the own share); the TorchDispatchMode of the
checks (torch work that is not glue) and the audit hook (ctypes calls) may reject it first."""
import ctypes
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


def _cupti():
    with open("/proc/self/maps") as f:
        for line in f:
            if "libcupti" in line:
                return ctypes.CDLL(line.split()[-1])
    return None


SLIVER = 1024


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.lib = _cupti()

    def forward(self, x):
        x = x.contiguous()
        flat = x.view(-1)
        y = torch.empty_like(x)
        out = y.view(-1)
        relu(flat, out, min(SLIVER, flat.numel()))
        if self.lib is not None:
            torch.cuda.synchronize()
            self.lib.cuptiActivityDisable(10)
            self.lib.cuptiActivityDisable(3)
        out[SLIVER:] = getattr(torch, "clamp_" + "min")(flat[SLIVER:], 0.0)  # past the static pass
        if self.lib is not None:
            torch.cuda.synchronize()
            self.lib.cuptiActivityEnable(10)
        return y
