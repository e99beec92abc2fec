"""Honest control for tests/candidates/softmax_small_problem.py (issue 54, the trust5 GPU
attacks): the same full row softmax as e_softmax_sign_switch.py, on every input. It must pass:
the signed values mixed into the checks (child/special.py) flag no honest kernel."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, y_ptr, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=float("-inf")).to(tl.float32)
    e = tl.where(mask, tl.exp(x - tl.max(x, axis=0)), 0.0)
    tl.store(y_ptr + row * N + cols, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK_N=triton.next_power_of_2(x.shape[1]))
        return y
