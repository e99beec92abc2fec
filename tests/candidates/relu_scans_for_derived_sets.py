"""Looks through its own process, at import, for what the harness will check (issue 54, class
4): the candidate's process is forked from the server, so anything the server knew at the fork
is in its memory. It prints what it finds to its log; the test reads the log. (Run with the
defences and the static pass off: gc is what it reads with.)"""
import gc
import json

import torch
import torch.nn as nn
import triton
import triton.language as tl

found = []
for obj in gc.get_objects():
    if isinstance(obj, dict):
        for key in ("derived_sources", "derived_overrides", "sets"):  # the job's, the server's Job's
            try:
                value = obj.get(key)
            except TypeError:
                continue
            if key == "sets" and not (isinstance(value, list) and value and isinstance(value[0], dict)
                                      and "overrides" in value[0]):
                continue
            if value:
                found.append({key: repr(value)[:2000]})
    elif type(obj).__name__ == "DerivedSets":
        found.append({"DerivedSets": repr(getattr(obj, "sources", None))[:2000]})
print("SCAN " + json.dumps(found), flush=True)


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
