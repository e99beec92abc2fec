"""Cost of the per-job jail: time from fork to "ready inside the jail", median of N.

    python benchmarks/jail_startup.py [--n 20] [--no-torch]

Imports torch first (as the harness server does) so the fork copies a realistic address
space, then for each mode forks N jobs; each job enters the jail (kernelagent/harness/server/
jail.py) and reports the monotonic time when it is ready (CLOCK_MONOTONIC is not namespaced,
so both sides read the same clock). "fork" is the baseline: fork and report, no jail.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernelagent.harness.jail import namespaces as jail  # noqa: E402


def one(mode: str, scratch_root: Path) -> float:
    scratch = Path(tempfile.mkdtemp(dir=scratch_root))
    r, w = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            if mode != "fork":
                jail.enter_job_jail(scratch, [scratch_root], [w], mode)
            os.write(w, repr(time.monotonic()).encode())
        finally:
            os._exit(0)
    os.close(w)
    ready = float(os.read(r, 64))
    os.close(r)
    os.waitpid(pid, 0)
    return (ready - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    if not args.no_torch:
        import torch  # noqa: F401  # pyflakes: imported for its address space
    root = Path(tempfile.mkdtemp(prefix="kernelagent-jail-bench-"))
    rows = {}
    for mode in ("fork", "none", "namespaces"):
        one(mode, root)  # warm-up
        times = [one(mode, root) for _ in range(args.n)]
        rows[mode] = {"median_ms": round(statistics.median(times), 2), "min_ms": round(min(times), 2),
                      "max_ms": round(max(times), 2), "n": args.n}
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"torch_imported": not args.no_torch, "kernel": os.uname().release, **rows}, indent=1))


if __name__ == "__main__":
    main()
