"""Trace attack 6a (issue 55): one launch serving several timed calls (cached by the input's
address, shape and version).

The output of a call is remembered under (data_ptr, shape, _version) of its input, and returned
as is (no device work at all) when a later call hands the same tensor, unchanged, again; any other
input runs the honest Triton ReLU. Outputs are correct for every input seen (the same memory, not
written since). Where the harness gives every timed call inputs of its own (fresh memory), the
cache never hits and this is the honest kernel: then it passes, and the test says so.
Should be caught by: idle-call (a timed call that ran no device work while the checks ran
kernels) / launch-mismatch; the checks' output-reuse checks may reject it first."""
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
        self.hits = 0

    def forward(self, x):
        key = (x.data_ptr(), tuple(x.shape), x._version)
        if key in self.cache:
            self.hits += 1
            return self.cache[key]
        x = x.contiguous()
        y = relu(x, torch.empty_like(x), x.numel())
        self.cache = {key: y}
        return y
