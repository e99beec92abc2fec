"""Class 15 (sandbox): tries to write into the real home directory and the repository
(found through PYTHONPATH), with a marker name the test looks for."""
import os
import pwd

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

MARKER = "kernelagent-escape-marker.txt"
_results = {}
_targets = [pwd.getpwuid(os.getuid()).pw_dir] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
for _dir in _targets:
    try:
        with open(os.path.join(_dir, MARKER), "w") as _f:
            _f.write("escaped")
        _results[_dir] = "written"
    except OSError as _exc:
        _results[_dir] = repr(_exc)
print("write attempts:", _results)


class ModelNew(nn.Module):
    def forward(self, x):
        return relu(x)
