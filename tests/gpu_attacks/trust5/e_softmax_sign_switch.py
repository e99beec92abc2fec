"""Hostile (issue 54, attack e: a softmax that skips its reduction where the input looks like the
problem's own), for tests/candidates/softmax_small_problem.py, whose inputs are torch.rand
(all in [0, 1)). In its one kernel each row measures its own share of negative values, `(x < 0)`:
* a row that is mostly signed (the old "alt" check was a set of signed normal values alone:
  about half negative) gets the full, correct softmax (row max, exp, row sum);
* any other row gets the shortcut: no max reduction, exp(max(x, 0)) / its row sum; exact on
  [0, 1), wildly wrong on negative values (each becomes exp(0) = 1).
Note: the detector is the share of negatives, not `(x < 0).any()`: a kernel that took the full
path wherever ANY value is negative would compute every signed input correctly and be no cheat.

What must catch it: child/special.py: the signed values are mixed into the problem's own inputs
(whole lines, a quarter to a half of the elements), so in the "alt" check the rows that are not
special themselves carry signed COLUMNS (an eighth to a quarter negative): the shortcut runs on
them, and their signed elements come out wrong. The verdict must be `incorrect`, never `correct`.
Run by tests/test_trust5_gpu.py::test_hostile_candidates_get_no_better_than_their_honest_verdict.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

SIGNED_SHARE = 0.4


@triton.jit
def softmax_sign_switch_kernel(x_ptr, y_ptr, N, SHARE: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    negative = tl.sum(tl.where(mask & (x < 0.0), 1.0, 0.0), axis=0)
    signed = negative >= SHARE * N
    # full path: the row max subtracted; shortcut: no max, negatives clamped to 0 ("inputs are in [0, 1)")
    m = tl.where(signed, tl.max(tl.where(mask, x, float("-inf")), axis=0), 0.0)
    z = tl.where(signed, x - m, tl.maximum(x, 0.0))
    e = tl.where(mask, tl.exp(z), 0.0)
    tl.store(y_ptr + row * N + cols, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.shape[1]
        softmax_sign_switch_kernel[(x.shape[0],)](x, y, n, SHARE=SIGNED_SHARE, BLOCK_N=triton.next_power_of_2(n))
        return y
