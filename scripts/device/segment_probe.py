"""Issue 42: why does the first call of a timed-loop segment read slow for a host-heavy kernel?

On an H100 (2026-11-27) our 27_batchnorm_eval (one Triton launch, 0.072 ms on the profiler) ran
its timed loop in 256 segments of 2 calls, and in some runs each segment's first call read slow
(median 0.0851 ms against 0.0730 ms for the second): the agreement table's one miss (+18.1%).
Between segments the server compares outputs with the candidate's process stopped (SIGSTOP),
then sends the next segment's `go`. The suspect: the host's first launch after that wait takes
longer than the 150 us launch cover, so the device idles inside the timed events.

This probe runs the harness's own timer (child/timing.Timer, `_one_out`) and fresh input sets
(child/inputs.FreshInputs) on a problem and its solution (trusted: our own), in a child process
that the parent drives segment by segment as the server does, optionally stopping it for
`--gap-ms` between segments. Every call's raw readings (event ms, host ms) go to
$OUT/segment_probe.jsonl; the summary compares each position in a segment, for each launch cover.

    python scripts/device/segment_probe.py [--problem benchmarks/level1/27_batchnorm_eval.py]
        [--segments 64] [--calls 2] [--gap-ms 3] [--covers 150,300,600] [--no-stop]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def child(args: argparse.Namespace) -> int:
    """Load the pair, then answer `go COVER SEED` lines with one segment's raw readings."""
    import importlib.util

    import torch

    from kernelagent.harness.child import inputs as inputs_mod, timing

    def load(path: str, name: str):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda":
        os.environ["TRITON_INTERPRET"] = "1"  # off the GPU machine only: times not meaningful
    problem, solution = load(args.problem, "problem"), load(args.solution, "solution")
    with torch.device(device):
        model = solution.ModelNew(*problem.get_init_inputs())
    smoke = device.type != "cuda"
    timers: dict[float, timing.Timer] = {}
    kept = None
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        _, cover, seed = line.split()
        cover_us = float(cover)
        if cover_us not in timers:
            timers[cover_us] = timing.Timer(device, flush_bytes=2 * 50 * 2**20, launch_cover_us=cover_us)
        timer = timers[cover_us]
        sets = inputs_mod.FreshInputs(problem, int(seed), smoke, device, budget_bytes=args.calls * 2**30)
        readings = []
        with torch.no_grad():
            for i in range(args.calls):
                event, host, result = timer._one_out(model, sets[i])
                if kept is None:
                    kept = torch.empty_like(result)
                kept.copy_(result)  # the harness copies the output aside after each call
                readings.append([round(event, 5), round(host, 5)])
                del result
        del sets
        out.write(json.dumps({"readings": readings, "event_pair_ms": timer.event_ms,
                              "overhead_ms": timer.overhead_ms}) + "\n")
        out.flush()
    return 0


def parent(args: argparse.Namespace) -> int:
    path = Path(os.environ.get("OUT", "/tmp")) / "segment_probe.jsonl"
    covers = [float(c) for c in args.covers.split(",")]
    proc = subprocess.Popen([sys.executable, __file__, "--child", "--problem", args.problem, "--solution", args.solution,
                             "--calls", str(args.calls)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin and proc.stdout
    try:
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit("error: the probe's child did not start")
        with path.open("a") as fh:
            for cover in covers:
                by_position: dict[int, list[tuple[float, float]]] = {}
                for segment in range(args.segments):
                    proc.stdin.write(f"go {cover} {1000 + segment * args.calls}\n")
                    proc.stdin.flush()
                    answer = proc.stdout.readline()
                    if not answer:
                        raise SystemExit("error: the probe's child ended (its stderr is above)")
                    report = json.loads(answer)
                    if not args.no_stop:
                        os.kill(proc.pid, signal.SIGSTOP)  # the server compares with the candidate stopped
                    time.sleep(args.gap_ms / 1e3)
                    if not args.no_stop:
                        os.kill(proc.pid, signal.SIGCONT)
                    for position, (event, host) in enumerate(report["readings"]):
                        by_position.setdefault(position, []).append((event, host))
                    fh.write(json.dumps({"cover_us": cover, "segment": segment, "stop": not args.no_stop,
                                         "gap_ms": args.gap_ms, **report}) + "\n")
                pair = report["event_pair_ms"]
                line = [f"cover {cover:5.0f} us:"]
                for position, rows in sorted(by_position.items()):
                    events = [e - pair for e, _ in rows]
                    line.append(f"call {position}: event median {statistics.median(events):.4f} ms "
                                f"(max {max(events):.4f}), host median {statistics.median(h for _, h in rows):.4f}")
                print(" | ".join(line), flush=True)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problem", default=str(ROOT / "benchmarks/level1/27_batchnorm_eval.py"))
    parser.add_argument("--solution", default=str(ROOT / "benchmarks/solutions/level1/27_batchnorm_eval.py"))
    parser.add_argument("--segments", type=int, default=64)
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--gap-ms", type=float, default=3.0, help="the pause between segments (the server's checks)")
    parser.add_argument("--covers", default="150,300,600", help="launch covers to try, us, comma-separated")
    parser.add_argument("--no-stop", action="store_true", help="pause without stopping the child (no SIGSTOP)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    raise SystemExit(main())
