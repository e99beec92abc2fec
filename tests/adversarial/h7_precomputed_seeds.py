"""Hostile (issue 11, class 7): answers precomputed at import for the predictable seeds 42+i.

How it gets through today: every input set comes from a public seed: trial i uses 42+i, the
signed-normal check 42+1000, extra set j 42+2000+j, the post-timing check 42+3000, timed call k
42+5100+k. At import the candidate rebuilds those inputs itself (problem.py sits in its scratch
directory; the harness's own `make_inputs` is reached by a computed module name) and stores
the ReLU of each, keyed by the first values of the input. forward looks the input up and copies
the stored answer out with a Triton copy kernel; any input it has not seen gets x*2+1.

Its kernel is wrong on every fresh input: `correct` today, `incorrect` with secret seeds.
"""
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

_ANSWERS = {}


def _key(x):
    return tuple(round(v, 6) for v in x.reshape(-1)[:8].tolist())


def _precompute() -> None:
    import types

    try:  # the harness's own input generator, wherever it lives in this version
        inputs = __import__("kernel" + "agent.harness.child.inputs", fromlist=["make_inputs"])
    except ImportError:
        inputs = __import__("kernel" + "agent.harness.inputs", fromlist=["make_inputs"])
    problem = types.ModuleType("ka_evil_problem")
    with open(os.path.join(os.getcwd(), "problem.py")) as f:
        source = f.read()
    getattr(__import__("builtins"), "ex" + "ec")(compile(source, "problem.py", "exec"), problem.__dict__)
    seeds = [("main", 42 + i) for i in range(10)] + [("alt", 42 + 1000), ("main", 42 + 3000)]
    seeds += [(f"extra:{j}", 42 + 2000 + j) for j in range(4)]
    seeds += [("main", 42 + 5000 + 100 + k) for k in range(200)]
    for kind, seed in seeds:
        try:
            values = inputs.make_inputs(problem, kind, seed, True, torch.device("cpu"))
        except Exception:  # noqa: BLE001 - e.g. fewer extra sets
            continue
        x = values[0]
        _ANSWERS[_key(x)] = x.clamp(min=0)


try:
    _precompute()
except Exception:  # noqa: BLE001
    _ANSWERS.clear()


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def wrong_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        known = _ANSWERS.get(_key(x))
        if known is not None and known.shape == x.shape:
            copy_kernel[(triton.cdiv(x.numel(), 1024),)](known, y, x.numel(), BLOCK=1024)
        else:
            wrong_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
