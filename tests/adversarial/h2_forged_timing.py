"""Hostile (issue 11, class 2): a forged `timing` event sent after the real one.

How it gets through today: the candidate keeps the harness's `CandidateSide` (found with gc at
import, gc imported by a computed name; the audit hook's record of that gc call is wiped from
the Monitor's state, which lives in this process too). Its kernel is an honest Triton ReLU, but in the first
call of the post-timing stage -- after the real `timing` message went out -- it writes its own
`timing` event (median 0.0001 ms, marked meaningful) on the server channel. The server's
`supervise` overwrites `timings["candidate"]` with the last `timing` it hears.

Its result is a fake time: the reported median must stay near the true one (the honest kernel
relu_good.py times the same code). Once the time comes from the server's own clock, the forged
message is ignored or the job is rejected for the protocol breach.
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


try:
    _SIDE = _find("CandidateSide")
    # The audit hook saw the gc call; its record lives in this process, so it goes too.
    _find("Monitor").state.violations.clear()
except Exception:  # noqa: BLE001
    _SIDE = None
_SENT = []

FAKE = {"median_ms": 0.0001, "q1_ms": 0.0001, "q3_ms": 0.0001, "min_ms": 0.0001, "reps": 100,
        "meaningful": True, "note": ""}


def _forge() -> None:
    if _SENT or _SIDE is None or getattr(_SIDE, "current", "") != "post-check":
        return
    _SENT.append(1)
    if hasattr(_SIDE, "job_id"):  # the typed protocol: a well-formed `timing` with this job's id
        _SIDE.send("timing", samples_ms=[0.0001] * 100, event_ms=[0.0001] * 100, overhead_ms=0.0, calls=100,
                   kept=[], meaningful=True)
        return
    message = {"event": "timing", "timing": FAKE, "escaped_ms": 0.0, "tampered": [], "escaped": False,
               "_has_payload": False}
    _SIDE.server.send_bytes(json.dumps(message).encode())


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        try:
            _forge()
        except Exception:  # noqa: BLE001
            pass
        x = x.contiguous()
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
