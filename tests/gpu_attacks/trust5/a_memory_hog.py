"""Hostile (issue 54, attack a: laundering through the reference): a WRONG ReLU that takes
almost all of the device's free memory (95% of torch.cuda.mem_get_info()'s free bytes, at import
and again at its first call) and keeps it, so that the reference's process (another process on
the same device) fails its own allocations. Were that failure believed as the harness's, the
verdict would be `harness_error` (no penalty, no score) for a kernel that is wrong.

What must catch it: server/failures.py (an infrastructure verdict rests on our own processes'
evidence; a job that ran out of memory is re-run alone only when our memory ledger had OTHER
jobs' memory beside it, note_memory_beside) and the candidate's memory cap. The verdict must be
the candidate's own (incorrect, runtime_error, rejected, crashed), or a re-run alone that then
judges it: never a `harness_error` that stands, never `correct`.
Run by tests/test_trust5_gpu.py::test_memory_hog_is_judged_as_the_candidate.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

_HELD = []


def _hog() -> None:
    if not torch.cuda.is_available():
        return
    for share in (0.95, 0.8, 0.5):
        try:
            free, _ = torch.cuda.mem_get_info()
            _HELD.append(torch.empty(int(free * share), dtype=torch.uint8, device="cuda"))
            return
        except Exception:  # noqa: BLE001 - take what we can
            continue


_hog()


@triton.jit
def wrong_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        _hog()  # whatever was freed since import, taken again
        x = x.contiguous()
        y = torch.empty_like(x)
        wrong_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
