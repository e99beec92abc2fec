"""Hostile (issue 54, attack c: a spare evidence session taken just before it expires): PyTorch
does the work behind a token Triton kernel (the name read through a computed string, so the
static pass is off the scent), submitted with `evidence="ncu"` right as the spare Nsight Compute
session that the previous job of the same problem left (server/evidence.py _start_spare) reaches
SPARE_WAIT_S and ends by itself. A session that dies under the job must not turn into a pass
(no evidence read as no library kernel) nor into a `harness_error` that hides the cheat.

What must catch it: server/evidence.py (a spare is taken only while alive, else the job starts
its own session; an evidence session that could not run is a review flag, never a win) and the
evidence itself (ncu sees the library kernel doing the work). The verdict must not pass and must
not be `harness_error`.
Run by tests/test_trust5_gpu.py::test_a_spare_taken_as_it_expires_gives_the_cheat_no_win (slow:
it waits SPARE_WAIT_S, so it runs only with KERNELAGENT_TRUST5_SPARE=1).
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def touch_kernel(x_ptr, BLOCK: tl.constexpr):
    tl.load(x_ptr + tl.arange(0, BLOCK))


class ModelNew(nn.Module):
    def forward(self, x):
        touch_kernel[(1,)](x, BLOCK=16)
        return getattr(torch, "re" + "lu")(x)
