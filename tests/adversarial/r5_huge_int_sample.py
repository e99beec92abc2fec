"""Hostile (issue 54, class 5): a timing sample of 10**400 ms hiding a caching hack.

Its kernel is an honest ReLU, but every call of the timed loop returns the output it remembered
for that shape: the timed calls the server verifies in secret would show it. The
sample's OverflowError came first (server/timed.py checks the samples before the segment's
comparisons): a harness error, the cache never seen. Bounded JSON refuses the integer by its
digits: `rejected: protocol`.
"""
import json

import torch
import torch.nn as nn
import triton
import triton.language as tl

_connection = __import__("multi" + "processing.connection", fromlist=["Connection"])
_Conn = getattr(_connection, "Conn" + "ection")
_send = _Conn.send_bytes
_TIMED = []  # set once the timed loop has begun: checks before it see honest outputs


def _send_forged(self, buf, offset=0, size=None):
    data = bytes(buf)
    if b'"type":"warmed"' in data:
        _TIMED.append(True)
    if b'"type":"timing"' in data:
        message = json.loads(data)
        message["samples_ms"] = [10**400 for _ in message["samples_ms"]]
        return _send(self, json.dumps(message, separators=(",", ":")).encode())
    return _send(self, buf, offset, size)

setattr(_Conn, "send_bytes", _send_forged)


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = {}

    def forward(self, x):
        key = tuple(x.shape)
        if key in self.cache and _TIMED:
            return self.cache[key].clone()
        x = x.contiguous()
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        self.cache[key] = y
        return y
