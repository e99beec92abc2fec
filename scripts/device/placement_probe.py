"""Issue 42: do KernelBench's 4 ms elementwise kernels run at two speeds depending on where their
buffers sit in device memory? A clock apart from the harness's: CUDA events around
torch.clamp(x, min=0, out=y) (a ReLU) on fixed pairs of 6.4 GB buffers (KernelBench's
level1/19_ReLU size, 4096 x 393216 fp32), every ordered pair of N buffers, each timed REPS times,
the whole sweep ROUNDS times. A pair that reads slow in every round while others read fast puts
the cause in the buffers' placement, not in any harness. Also the read-only time (x.sum) per buffer.
JSON lines to $OUT/placement.jsonl and a summary on stdout. Trusted code only (no candidate).

On an H100 (2026-11-27) no pair of 10 fixed buffers read slow, while the harness's loop ran the same
kernel at 4.29 and 4.98 ms. `--loop` then runs a loop shaped like the harness's, with each part
switchable, and prints every call's time with the addresses of its input and output, so that the
slow calls can be tied to a part or to where the allocator put a buffer:
  a fresh input each call (torch.randn into a new tensor; --reuse-input: one input for all),
  the L2 flush before each call (--no-flush), a new output each call (torch.relu), and the
  output copied into one of two kept slots after each call (--no-kept).

    python scripts/device/placement_probe.py [--buffers 8] [--reps 5] [--rounds 3]
    python scripts/device/placement_probe.py --loop [--calls 40] [--no-flush] [--no-kept] [--reuse-input]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch

# The CPU fallback only lets the script be tried off the GPU machine: its times mean nothing.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class _HostEvent:
    def __init__(self, enable_timing: bool = True):
        self.t = 0.0

    def record(self) -> None:
        import time

        self.t = time.perf_counter()

    def elapsed_time(self, end: "_HostEvent") -> float:
        return (end.t - self.t) * 1e3


Event = torch.cuda.Event if DEVICE == "cuda" else _HostEvent


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


class Gpu:
    """NVML readings after each call (ctypes; nothing when NVML is missing): SM and memory clocks
    (MHz), power (W), temperature (C) and the clock-event reasons bitmask (power cap 0x4, HW
    slowdown 0x8, SW thermal 0x20, HW thermal 0x40, HW power brake 0x80), so that a run of slow
    calls can be tied to the card's state."""

    def __init__(self):
        import ctypes

        self.ct = ctypes
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
            if self.lib.nvmlInit_v2() != 0:
                raise OSError("nvmlInit failed")
            self.handle = ctypes.c_void_p()
            if self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.handle)) != 0:
                raise OSError("no handle")
        except (OSError, AttributeError):
            self.lib = None

    def read(self) -> dict:
        if self.lib is None:
            return {}
        ct, out = self.ct, {}
        value = ct.c_uint()
        for name, clock in (("sm_mhz", 1), ("mem_mhz", 2)):
            if self.lib.nvmlDeviceGetClockInfo(self.handle, clock, ct.byref(value)) == 0:
                out[name] = value.value
        if self.lib.nvmlDeviceGetPowerUsage(self.handle, ct.byref(value)) == 0:
            out["watts"] = round(value.value / 1000, 1)
        if self.lib.nvmlDeviceGetTemperature(self.handle, 0, ct.byref(value)) == 0:
            out["temp_c"] = value.value
        reasons = ct.c_ulonglong()
        for fn in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            if hasattr(self.lib, fn) and getattr(self.lib, fn)(self.handle, ct.byref(reasons)) == 0:
                out["reasons"] = hex(reasons.value)
                break
        return out


def timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        start, end = Event(enable_timing=True), Event(enable_timing=True)
        sync()
        start.record()
        fn()
        end.record()
        sync()
        out.append(start.elapsed_time(end))
    return out


def harness_like(args) -> int:
    """A loop shaped like the harness's timed loop (see the module docstring), every call's time and
    buffer addresses to $OUT/placement_loop.jsonl."""
    path = Path(os.environ.get("OUT", "/tmp")) / "placement_loop.jsonl"
    shape = (args.rows, args.cols)
    flush = torch.empty(2 * 50 * 2**20 // 4, dtype=torch.int32, device=DEVICE)
    kept = [torch.empty(shape, device=DEVICE) for _ in range(0 if args.no_kept else 2)]
    fixed = torch.randn(shape, device=DEVICE) if args.reuse_input else None
    times = []
    gpu = Gpu()
    with path.open("a") as fh:
        for call in range(args.calls):
            x = fixed if fixed is not None else torch.randn(shape, device=DEVICE)
            if not args.no_flush:
                flush.zero_()
            sync()
            start, end = Event(enable_timing=True), Event(enable_timing=True)
            start.record()
            y = torch.relu(x)
            end.record()
            sync()
            ms = start.elapsed_time(end)
            if kept:
                kept[call % len(kept)].copy_(y)
            row = {"call": call, "ms": round(ms, 4), "x_gib": round(x.data_ptr() / 2**30, 3),
                   "y_gib": round(y.data_ptr() / 2**30, 3), "flush": not args.no_flush, "kept": bool(kept),
                   "fresh_input": fixed is None, **gpu.read()}
            fh.write(json.dumps(row) + "\n")
            times.append((ms, row["x_gib"], row["y_gib"], row))
            del y
            if fixed is None:
                del x
    fast = min(t[0] for t in times[1:])
    slow = [(i, t, xa, ya, row) for i, (t, xa, ya, row) in enumerate(times) if i and t > 1.05 * fast]
    print(f"loop: {args.calls} calls, flush={not args.no_flush}, kept={not args.no_kept}, "
          f"fresh input={not args.reuse_input}: fastest {fast:.4f} ms, median {statistics.median(t[0] for t in times):.4f},"
          f" {len(slow)} calls above +5%")
    state = ("sm_mhz", "mem_mhz", "watts", "temp_c", "reasons")
    for i, t, xa, ya, row in slow[:20]:
        print(f"  call {i}: {t:.4f} ms, x at {xa} GiB, y at {ya} GiB; " + " ".join(f"{k}={row.get(k)}" for k in state))
    fast_rows = [row for i, (t, _, _, row) in enumerate(times) if i and t <= 1.05 * fast]
    for label, rows in (("fast", fast_rows), ("slow", [r for *_, r in slow])):
        if rows and rows[0].get("sm_mhz") is not None:
            print(f"  {label} calls ({len(rows)}): " + ", ".join(
                f"{k} {statistics.median(r[k] for r in rows if isinstance(r.get(k), (int, float))):.0f}"
                for k in state[:4] if any(isinstance(r.get(k), (int, float)) for r in rows)))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loop", action="store_true", help="a loop shaped like the harness's (see above)")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--no-flush", action="store_true")
    parser.add_argument("--no-kept", action="store_true")
    parser.add_argument("--reuse-input", action="store_true")
    parser.add_argument("--buffers", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=393216)
    args = parser.parse_args()
    if args.loop:
        return harness_like(args)
    path = Path(os.environ.get("OUT", "/tmp")) / "placement.jsonl"
    bufs = [torch.randn(args.rows, args.cols, device=DEVICE) for _ in range(args.buffers)]
    print(f"{torch.cuda.get_device_name() if DEVICE == 'cuda' else 'CPU (not meaningful)'}: {args.buffers} buffers of {bufs[0].numel() * 4 / 1e9:.1f} GB; "
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
