"""Hostile (issue 11, class 2): a forged `done` event sent before the server's plan.

How it gets through today: at import, the candidate finds the harness's `CandidateSide` object
with `gc.get_objects()` (gc imported by a computed name, so the static pass does not see it;
the audit hook records the gc call, but that record only reaches the verdict in the flags of
a `done` message, which this candidate writes itself). It sends `{"event": "done", "flags": []}`
on the side's own server channel. The server's `supervise` stops at `done`; no plan was sent
yet, so `_conclude` loops over an empty plan and returns CORRECT.

Its kernel is wrong (x*2+1). Once every planned check must have been compared in the reference
process before `correct`, this is `incorrect` (or `rejected` for the protocol breach).
"""
import json

import torch
import torch.nn as nn
import triton
import triton.language as tl


def _find(type_name):
    heap = __import__("g" + "c")
    for obj in heap.get_objects():
        if type(obj).__name__ == type_name:
            return obj
    return None


def _attack() -> None:
    side = _find("CandidateSide")
    if hasattr(side, "job_id"):  # the typed protocol: a well-formed `done` with this job's id
        side.send("done", flags=[], memory={})
    else:
        message = {"event": "done", "flags": [], "_has_payload": False}
        side.server.send_bytes(json.dumps(message).encode())


try:
    _attack()
except Exception:  # noqa: BLE001 - no channel to forge on: the wrong kernel is judged
    pass


@triton.jit
def wrong_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        wrong_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
