"""Issue 42: does device memory given back to the driver slow the kernels that run just after?

On an H100 (2026-11-27) the harness's timed loop ran KernelBench's 4 ms elementwise kernels at two
speeds (about 4.29 and 4.98 ms) in runs of consecutive calls that began at segment boundaries, where
the trusted reference has just checked a kept output and returned its cached memory to the driver
(`torch.cuda.empty_cache`, 13 GB at those sizes). With the defences off (no checks) every call ran
fast; CUDA events on fixed buffers never read slow. If the driver clears freed memory in the
background (copy engines), that clearing takes memory bandwidth from whatever runs next.

Each scenario primes a ReLU on fixed 6.4 GB buffers, does one thing, then times CALLS calls back to
back (CUDA events, a synchronize before each), with each call's start in ms after the thing:
  none          nothing (the control)
  cache-self    this process allocates and fills GB, then frees it into its cache (no empty_cache)
  free-self     the same, then torch.cuda.empty_cache() (memory back to the driver)
  free-other    a helper process frees GB it holds and empties its cache
  exit-other    a helper process holding GB exits
  alloc-other   a helper process allocates and fills GB (done before the calls start)
Then, as a candidate idle probe, the same scenarios with a device-to-device copy of COPY_MB timed
instead of the ReLU (host clock around copy + synchronize, every read's start after the thing).
First, the harness's own bandwidth reading (idle_probe.Bandwidth.read_us) idle and after each
scenario (`--bandwidth-only`: just that).
JSON lines to $OUT/scrub.jsonl, a summary on stdout. Trusted code only.

    python scripts/device/scrub_probe.py [--gb 13] [--calls 25] [--rows 4096 --cols 393216]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on the CPU the times mean nothing

HELPER = r"""
import sys, torch
dev = sys.argv[1]
z = None
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    if cmd == "alloc":
        z = torch.empty(int(arg), dtype=torch.uint8, device=dev).fill_(1)
    elif cmd == "free":
        z = None
        if dev == "cuda":
            torch.cuda.empty_cache()
    elif cmd == "exit":
        sys.stdout.write("bye\n"); sys.stdout.flush()
        break
    if dev == "cuda":
        torch.cuda.synchronize()
    sys.stdout.write("ok\n"); sys.stdout.flush()
"""


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


class Helper:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", HELPER, DEVICE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def ask(self, line: str) -> None:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if answer not in ("ok", "bye"):
            raise RuntimeError(f"helper answered {answer!r} to {line!r}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def event(kind: str, nbytes: int) -> float:
    """Prepare, then do the scenario's thing; return the host time it finished (perf_counter)."""
    if kind == "none":
        sync()
        return time.perf_counter()
    if kind in ("cache-self", "free-self"):
        z = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE).fill_(1)
        sync()
        del z
        if kind == "free-self" and DEVICE == "cuda":
            torch.cuda.empty_cache()
        sync()
        return time.perf_counter()
    helper = Helper()
    HELPERS.append(helper)  # closed after the calls (its exit would free memory among them)
    helper.ask(f"alloc {nbytes}")
    if kind == "alloc-other":  # it keeps what it allocated until close_helpers
        return time.perf_counter()
    if kind == "free-other":
        helper.ask("free")
        return time.perf_counter()
    helper.ask("exit")
    helper.proc.wait(timeout=30)
    return time.perf_counter()


HELPERS: list[Helper] = []


def close_helpers() -> None:
    while HELPERS:
        HELPERS.pop().close()


def run(kind: str, nbytes: int, fn, calls: int, device_clock: bool) -> list[tuple[float, float]]:
    """(ms after the thing, ms of the work) for each of `calls` runs of fn."""
    done = event(kind, nbytes)
    try:
        return _calls(done, fn, calls, device_clock)
    finally:
        close_helpers()


def bandwidth_section(args, nbytes: int, fh) -> None:
    """The harness's own bandwidth reading (idle_probe.Bandwidth.read_us, what server/gate.Bandwidth
    judges): READS readings on an idle device, then readings back to back after each scenario,
    each with its start after the thing, so the quiet threshold can be set from both."""
    from kernelagent.harness.child.idle_probe import Bandwidth

    read = Bandwidth(torch.device(DEVICE)).read_us
    idle = []
    for _ in range(args.reads):
        time.sleep(0.02)
        idle.append(read())
    if idle[0] is None:
        print("bandwidth: no reading on this device")
        return
    least = min(idle)
    print(f"bandwidth idle: {len(idle)} readings, least {least:.1f} us, median {statistics.median(idle):.1f}, "
          f"max {max(idle):.1f} (x{max(idle) / least:.3f})", flush=True)
    fh.write(json.dumps({"work": "bandwidth", "scenario": "idle", "reads": [round(x, 2) for x in idle]}) + "\n")
    for kind in args.scenarios.split(","):
        for rnd in range(args.rounds):
            done = event(kind, nbytes)
            rows = []
            try:
                while (time.perf_counter() - done) < 0.15:
                    began = time.perf_counter()
                    rows.append(((began - done) * 1e3, read()))
            finally:
                close_helpers()
            fh.write(json.dumps({"work": "bandwidth", "scenario": kind, "round": rnd,
                                 "rows": [[round(a, 2), round(b, 2)] for a, b in rows]}) + "\n")
            loud = [(a, b) for a, b in rows if b > 1.06 * least]
            print(f"bandwidth {kind:12s} round {rnd}: {len(rows)} readings in 150 ms, first {rows[0][1]:.1f} us "
                  f"(x{rows[0][1] / least:.3f}), {len(loud)} above x1.06"
                  + (f", the last starting {loud[-1][0]:.1f} ms after" if loud else ""), flush=True)


def _calls(done: float, fn, calls: int, device_clock: bool) -> list[tuple[float, float]]:
    rows = []
    for _ in range(calls):
        sync()
        began = time.perf_counter()
        if device_clock and DEVICE == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            sync()
            ms = start.elapsed_time(end)
        else:
            fn()
            sync()
            ms = (time.perf_counter() - began) * 1e3
        rows.append(((began - done) * 1e3, ms))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, default=13.0, help="memory each scenario allocates / frees")
    parser.add_argument("--calls", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=393216)
    parser.add_argument("--copy-mb", type=float, default=128.0)
    parser.add_argument("--scenarios", default="none,cache-self,free-self,free-other,exit-other,alloc-other")
    parser.add_argument("--reads", type=int, default=60, help="idle bandwidth readings")
    parser.add_argument("--bandwidth-only", action="store_true")
    args = parser.parse_args()
    path = Path(os.environ.get("OUT", "/tmp")) / "scrub.jsonl"
    nbytes = int(args.gb * 1e9)
    x = torch.randn(args.rows, args.cols, device=DEVICE)
    y = torch.empty_like(x)
    src = torch.empty(int(args.copy_mb * 2**20), dtype=torch.uint8, device=DEVICE).fill_(3)
    dst = torch.empty_like(src)

    def relu() -> None:
        torch.clamp(x, min=0, out=y)

    def copy() -> None:
        dst.copy_(src)

    for _ in range(3):
        relu(), copy()
    sync()
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU (not meaningful)"
    print(f"{name}: relu on {x.numel() * 4 / 1e9:.1f} GB buffers, {args.gb} GB per scenario, copy probe "
          f"{args.copy_mb} MB", flush=True)
    with path.open("a") as fh:
        bandwidth_section(args, nbytes, fh)
        if args.bandwidth_only:
            return 0
        for what, fn, device_clock, calls in (("relu", relu, True, args.calls), ("copy", copy, False, 4 * args.calls)):
            base: list[float] = []
            for kind in args.scenarios.split(","):
                for rnd in range(args.rounds):
                    rows = run(kind, nbytes, fn, calls, device_clock)
                    fh.write(json.dumps({"work": what, "scenario": kind, "round": rnd, "gb": args.gb,
                                         "rows": [[round(a, 3), round(b, 4)] for a, b in rows]}) + "\n")
                    times = [b for _, b in rows]
                    if kind == "none":
                        base += times
                    fast = min(base) if base else min(times)
                    slow = [(a, b) for a, b in rows if b > 1.05 * fast]
                    last_slow = max((a for a, _ in slow), default=None)
                    print(f"{what:5s} {kind:12s} round {rnd}: first {times[0]:.4f} ms, median "
                          f"{statistics.median(times):.4f}, {len(slow)}/{len(rows)} calls above +5% of {fast:.4f}"
                          + (f", the last starting {last_slow:.1f} ms after" if slow else ""), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
