"""Issue 42: why does the harness read some kernels above the profiler and ncu? One evaluation per
problem alone (in turn), then all together (--jobs N, each problem twice): the timed loop's shape
and source, the samples, and both clocks, as JSON lines under $OUT/timing_probe.jsonl.

On an H100 (2026-11-27) KernelBench's 4 ms elementwise kernels ran at two speeds inside the loop
(about 4.29 and 4.98 ms, in runs of consecutive calls; also alone), which fixed buffers timed by
CUDA events did not (placement_probe.py). `--variants` repeats the alone pass with parts of the
loop switched off, one at a time, to find the one that makes the slow calls:
  flush     EvalConfig(flush_l2=False)          no L2 flush before each call
  cover     EvalConfig(launch_cover_us=0)       no launch-cover spin
  defences  EvalConfig(defences=False)          no fresh inputs per call, no kept outputs, no monitor
`--set name=value` (repeatable) overrides any other EvalConfig field for every pass.

    python scripts/device/timing_probe.py [--jobs 4] [--variants] [--set launch_cover_us=0] \
        kb/level1/25_Swish kb/level1/19_ReLU ours/level1/27_batchnorm_eval
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from profiler_agreement import kernelbench_dir  # noqa: E402

from kernelagent.harness import EvalConfig, Evaluator  # noqa: E402
from kernelagent.harness.caller import profiling  # noqa: E402


def pair(label: str) -> tuple[Path, Path]:
    suite, key = label.split("/", 1)
    if suite == "kb":
        return kernelbench_dir() / f"{key}.py", ROOT / "benchmarks" / "kernelbench_solutions" / f"{key}.py"
    return ROOT / "benchmarks" / f"{key}.py", ROOT / "benchmarks" / "solutions" / f"{key}.py"


VARIANTS = {"flush": {"flush_l2": False}, "cover": {"launch_cover_us": 0.0}, "defences": {"defences": False}}


def parse_set(items: list[str]) -> dict:
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        if not hasattr(EvalConfig, name) or not value:
            raise SystemExit(f"error: --set {item!r}: not NAME=VALUE of an EvalConfig field")
        current = getattr(EvalConfig, name)
        out[name] = (value.lower() in ("1", "true", "yes")) if isinstance(current, bool) else type(current)(value)
    return out


def one(ev: Evaluator, label: str, mode: str, overrides: dict | None = None) -> dict:
    problem, solution = pair(label)
    started = time.monotonic()
    settings = {"trials": 1, "baselines": False, "profile": True, "kernel_evidence": False, **(overrides or {})}
    r = ev.evaluate(problem, solution.read_text(), EvalConfig(**settings))
    t = r.timings.get("candidate")
    c = profiling.clocks(r) if t else {}
    return {"label": label, "mode": mode, "settings": {k: v for k, v in settings.items() if k != "trials"},
            "status": r.status, "seconds": round(time.monotonic() - started, 1),
            "median_ms": t.median_ms if t else None, "q1": t.q1_ms if t else None, "q3": t.q3_ms if t else None,
            "min_ms": t.min_ms if t else None, "reps": t.reps if t else None, "source": t.source if t else None,
            "samples_ms": [round(x, 4) for x in (t.samples_ms if t else [])][:200],
            "profiler_ms": c.get("profiler_ms"), "timed_loop": r.timed_loop, "concurrency": r.concurrency,
            "flags": [f"{f.kind}: {f.message[:200]}" for f in r.flags], "kernels": (r.kernels or [])[:4]}


def summary(row: dict) -> str:
    """One line: the clocks, and every timed call as `.` (within 5% of the fastest) or `S`."""
    samples = row["samples_ms"] or []
    fast = min(samples) if samples else 0.0
    pattern = "".join("S" if x > 1.05 * fast else "." for x in samples)[:120]
    conc = row.get("concurrency") or {}

    def num(x, digits=4):
        return "-" if x is None else f"{x:.{digits}f}"

    return (f"{row['label']:32s} {row['mode']:20s} {row['status']:8s} median {num(row['median_ms'])} "
            f"min {num(row['min_ms'])} profiler {num(row['profiler_ms'])} source {row['source']} "
            f"bw_wait {conc.get('bandwidth_wait_s', 0):.3f}s copy_us {num(conc.get('copy_us'), 1)} {pattern}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("labels", nargs="+")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--variants", action="store_true", help="also each problem alone with flush, cover, "
                                                                 "defences off in turn")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    base = parse_set(args.set)
    out = Path(os.environ.get("OUT", "/tmp")) / "timing_probe.jsonl"
    with Evaluator(concurrency=args.jobs) as ev, out.open("a") as fh:
        passes = [("alone", base)] + ([(f"alone, no {name}", dict(base, **v)) for name, v in VARIANTS.items()]
                                      if args.variants else [])
        for mode, overrides in passes:
            for label in args.labels:
                row = one(ev, label, mode, overrides)
                fh.write(json.dumps(row, default=str) + "\n"); fh.flush()
                print(summary(row), flush=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            for row in pool.map(lambda lb: one(ev, lb, "together", base), args.labels * 2):
                fh.write(json.dumps(row, default=str) + "\n"); fh.flush()
                print(summary(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
