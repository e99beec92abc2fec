"""Issue 42: do KernelBench's 4 ms elementwise kernels run at two speeds depending on where their
buffers sit in device memory? A clock apart from the harness's: CUDA events around
torch.clamp(x, min=0, out=y) (a ReLU) on fixed pairs of 6.4 GB buffers (KernelBench's
level1/19_ReLU size, 4096 x 393216 fp32), every ordered pair of N buffers, each timed REPS times,
the whole sweep ROUNDS times. A pair that reads slow in every round while others read fast puts
the cause in the buffers' placement, not in any harness. Also the read-only time (x.sum) per buffer.
JSON lines to $OUT/placement.jsonl and a summary on stdout. Trusted code only (no candidate).

    python scripts/device/placement_probe.py [--buffers 8] [--reps 5] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch


def timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--buffers", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=393216)
    args = parser.parse_args()
    path = Path(os.environ.get("OUT", "/tmp")) / "placement.jsonl"
    bufs = [torch.randn(args.rows, args.cols, device="cuda") for _ in range(args.buffers)]
    print(f"{torch.cuda.get_device_name()}: {args.buffers} buffers of {bufs[0].numel() * 4 / 1e9:.1f} GB; "
          f"addresses (GiB): {[round(b.data_ptr() / 2**30, 2) for b in bufs]}", flush=True)
    by_pair: dict[tuple[int, int], list[float]] = {}
    with path.open("w") as fh:
        for rnd in range(args.rounds):
            for i, x in enumerate(bufs):
                read = timed(lambda: x.sum(), args.reps)
                fh.write(json.dumps({"round": rnd, "read": i, "ms": read}) + "\n")
                for j, y in enumerate(bufs):
                    if i == j:
                        continue
                    ms = timed(lambda: torch.clamp(x, min=0, out=y), args.reps)
                    by_pair.setdefault((i, j), []).extend(ms)
                    fh.write(json.dumps({"round": rnd, "in": i, "out": j, "ms": ms}) + "\n")
    medians = {k: statistics.median(v) for k, v in by_pair.items()}
    fast = min(medians.values())
    slow = {k: m for k, m in medians.items() if m > 1.05 * fast}
    print(f"fastest pair median {fast:.4f} ms; {len(slow)} of {len(medians)} pairs above +5%:")
    for (i, j), m in sorted(slow.items()):
        spread = by_pair[i, j]
        print(f"  in {i} -> out {j}: median {m:.4f} ms (+{100 * (m / fast - 1):.1f}%), "
              f"min {min(spread):.4f}, max {max(spread):.4f}")
    # within a pair across rounds: stable (a placement property) or not (something else)?
    within = [max(v) / min(v) for v in by_pair.values()]
    print(f"within-pair max/min over {args.rounds} rounds x {args.reps} reps: median {statistics.median(within):.3f}, "
          f"worst {max(within):.3f}")
    for k in ("in", "out"):
        rows = {}
        for (i, j), m in medians.items():
            rows.setdefault(i if k == "in" else j, []).append(m)
        print(f"by {k} buffer: " + ", ".join(f"{b}: {statistics.median(v):.4f}" for b, v in sorted(rows.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
