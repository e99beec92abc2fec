"""Issue 58: KernelBench's level1/45_Average_Pooling_2D (a 17.2 GB fp32 input, 16x64x2048x2048,
AvgPool2d(11)) read 7.09-7.57 ms in the harness over four agreement runs on an H200, ncu 6.99-7.16,
and the in-process profiler 7.20-9.26 ms, while every other problem of 50 us or more agreed. Does
the kernel's time depend on the allocation its input sits in? A clock apart from the harness's:
CUDA events around the pooling on ALLOCS fresh inputs in turn, each timed REPS times (L2 flushed
before each call), first with the device otherwise empty, then with BALLAST_GB of other buffers
allocated and freed between inputs (a crowded device's memory, as beside 8 evaluations).
Trusted code only; JSON lines to $OUT/avgpool.jsonl and a summary on stdout.

    python scripts/device/avgpool_probe.py [--allocs 6] [--reps 5] [--ballast-gb 60]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch


def timed(fn, flush: torch.Tensor, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--allocs", type=int, default=6)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--ballast-gb", type=float, default=60.0)
    args = parser.parse_args()
    out_dir = Path(os.environ.get("OUT", "/tmp/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    pool = torch.nn.AvgPool2d(11).to(dev)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    spin = torch.empty(1 << 28, dtype=torch.float32, device=dev)
    rows = []
    started = time.monotonic()
    for mode in ("empty", "crowded"):
        for i in range(args.allocs):
            ballast = []
            if mode == "crowded":  # other buffers, some kept across the input's allocation
                ballast = [torch.empty(int(args.ballast_gb * 2**30 / 8), dtype=torch.uint8, device=dev)
                           for _ in range(8)]
                del ballast[::2]
            x = torch.rand(16, 64, 2048, 2048, device=dev)
            for _ in range(20):  # the clocks up (a spin of work), as the timer's ramp
                spin.mul_(1.0)
            pool(x)
            torch.cuda.synchronize()
            times = timed(lambda: pool(x), flush, args.reps)
            row = {"mode": mode, "alloc": i, "ptr": hex(x.data_ptr()), "ms": [round(t, 4) for t in times],
                   "median_ms": round(statistics.median(times), 4)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            del x, ballast
            torch.cuda.empty_cache()
    with open(out_dir / "avgpool.jsonl", "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    for mode in ("empty", "crowded"):
        meds = [r["median_ms"] for r in rows if r["mode"] == mode]
        print(f"{mode}: medians {min(meds):.4f}-{max(meds):.4f} ms (spread {100 * (max(meds) / min(meds) - 1):.1f}%)"
              f" over {len(meds)} allocations")
    print(f"{torch.cuda.get_device_name()}; {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
