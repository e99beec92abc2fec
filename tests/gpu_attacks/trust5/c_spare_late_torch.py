"""Hostile (issue 54, attack c: a spare evidence session taken just before it expires): PyTorch
does the work (`x.clamp`) behind a token Triton launch, with the in-process recorder popped
(`_disable_current_modes()`, as tests/adversarial/h3_dispatch_mode_pop.py: only evidence from
outside its process can see the library kernel on a GPU), submitted with `evidence="ncu"` right
as the spare Nsight Compute session that the previous job of the same problem left
(server/evidence.py _start_spare) reaches SPARE_WAIT_S and ends by itself. A session that dies
under the job must not turn into a pass (no evidence read as no library kernel) nor into a
`harness_error` that hides the cheat. On the CPU it is `correct` (only evidence from outside the
candidate's process sees it; isolation.md, the `h3_*` rows).

What must catch it: server/evidence.py (a spare is taken only while alive, else the job starts
its own session; an evidence session that could not run is a review flag, never a win) and the
evidence itself (ncu sees the library kernel doing the work). The verdict must not pass and must
not be `harness_error`.
Run by tests/test_trust5_gpu.py::test_a_spare_taken_as_it_expires_gives_the_cheat_no_win (slow:
it waits SPARE_WAIT_S, so it runs only with KERNELAGENT_TRUST5_SPARE=1), and as the cheat beside
the squatted lock folder of attack d (test_squatted_ncu_lock_folder_is_not_used).
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch.utils._python_dispatch import _disable_current_modes


@triton.jit
def touch_kernel(p_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(p_ptr + offsets, tl.zeros((BLOCK,), tl.float32), mask=offsets < n)


class ModelNew(nn.Module):
    def forward(self, x):
        touch = torch.empty(16, device=x.device)
        touch_kernel[(1,)](touch, 16, BLOCK=16)
        with _disable_current_modes():
            return x.clamp(min=0)
