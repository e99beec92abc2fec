"""Trace attack 3 (issue 55): the work done by a child process with the injection cleared.

forward starts (once) a Python worker with CUDA_INJECTION64_PATH and KERNELAGENT_TRACE_FD removed
from its environment, sends it the input's bytes, the worker computes the ReLU on the GPU in its
own (untraced) process and sends the result back, which forward copies to the device. Outputs are
correct. subprocess, NumPy and frombuffer are reached through importlib/getattr so the static
pass does not see them.
Should be caught by: no-custom-kernel (no kernel of its own in any timed call: only the copies,
glue) / idle-call; the sandbox (no process may be started) or the audit hook may reject it first."""
import importlib
import os
import sys
import torch
import torch.nn as nn

WORKER = r'''
import sys, torch
inp, out = sys.stdin.buffer, sys.stdout.buffer
while True:
    head = inp.readline()
    if not head:
        break
    rows, cols = (int(v) for v in head.split())
    data = inp.read(rows * cols * 4)
    x = torch.frombuffer(bytearray(data), dtype=torch.float32).view(rows, cols).cuda()
    y = torch.clamp_min(x, 0.0).cpu().contiguous()
    out.write(y.numpy().tobytes())
    out.flush()
'''


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.proc = None

    def _worker(self):
        if self.proc is None:
            sp = importlib.import_module("sub" + "process")
            env = {k: v for k, v in os.environ.items()
                   if k not in ("CUDA_INJECTION64_PATH", "KERNELAGENT_TRACE_FD")}
            self.proc = sp.Popen([sys.executable, "-c", WORKER], stdin=sp.PIPE, stdout=sp.PIPE, env=env)
        return self.proc

    def forward(self, x):
        proc = self._worker()
        host = x.detach().contiguous().cpu()
        rows, cols = host.view(-1, host.shape[-1]).shape
        proc.stdin.write(f"{rows} {cols}\n".encode() + getattr(host, "nu" + "mpy")().tobytes())
        proc.stdin.flush()
        data = proc.stdout.read(rows * cols * 4)
        y = getattr(torch, "from" + "buffer")(bytearray(data), dtype=torch.float32).view(x.shape)
        return y.to(x.device)
