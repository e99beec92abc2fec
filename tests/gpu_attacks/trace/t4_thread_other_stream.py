"""Trace attack 4 (issue 55): a thread launching torch work on another stream.

forward launches its own Triton kernel on a sliver, then hands the rest to a thread that runs a
torch computation on a stream of its own; forward waits only until the thread has queued the work
(not for the work), so the call returns before the bulk runs. Outputs are correct once the device
is synchronised (the harness synchronises before it compares). threading and the stream are
reached through importlib/getattr so the static pass does not see them.
Should be caught by: outside-interval (work on another stream than the markers' outside every
call, or running past the call's end), hidden-work (the sliver is under the own share); the
TorchDispatchMode of the checks may reject the torch work first."""
import importlib
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


SLIVER = 1024
_threading = importlib.import_module("thr" + "eading")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = None

    def forward(self, x):
        if self.side is None:
            self.side = getattr(torch.cuda, "Str" + "eam")()
        x = x.contiguous()
        flat = x.view(-1)
        y = torch.empty_like(x)
        out = y.view(-1)
        relu(flat, out, min(SLIVER, flat.numel()))
        queued = _threading.Event()
        ready = torch.cuda.Event()
        ready.record()
        side = self.side

        def work():
            with getattr(torch.cuda, "str" + "eam")(side):
                side.wait_event(ready)
                out[SLIVER:] = getattr(torch, "clamp_" + "min")(flat[SLIVER:], 0.0)  # past the static pass
            queued.set()

        _threading.Thread(target=work, daemon=True).start()
        queued.wait()
        return y
