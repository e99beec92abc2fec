"""What the kernel tracer (issue 55) costs the timings: the same candidates evaluated traced and
untraced, alternating, in one harness server.

    python benchmarks/trace_cost.py --out trace_cost.json [--filter 'level1/[1-9]_*'] [--rounds 4]
        [--jobs 4]

One Evaluator (one server) first primes each problem (its compile caches), then
evaluates every solution `--rounds` times traced (the default EvalConfig) and `--rounds` times
untraced (`EvalConfig(trace=False)`: the job's processes run without the tracer), each a distinct
candidate (a comment line makes the copies differ), traced and untraced interleaved and their
order swapped every round, `--jobs` at a time (every timed loop still holds the timing slot
alone). Baselines and audits are off for both, and the untraced copies skip the evidence (Nsight
Compute would judge them otherwise): none of these touches the timed loop.

Per solution: the candidate's timed median (ms) of each copy, the median of each side and their
difference in percent; the start and compile stages of each side (the tracer loads at CUDA's
start and instruments each module as it loads). Pass means the issue's bounds: a median
difference of at most 1% for kernels of 50 us or more and 3% below. Needs a GPU.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

LONG_KERNEL_MS = 0.05  # at or above: the difference may be at most 1%; below, 3%
BOUND_LONG, BOUND_SHORT = 1.0, 3.0


def solutions(pattern: str) -> list[tuple[str, Path, str]]:
    """(key, problem, solution source) for every solution whose `level/name` matches."""
    found = []
    for solution in sorted((HERE / "solutions").glob("level*/*.py")):
        key = f"{solution.parent.name}/{solution.stem}"
        problem = HERE / solution.parent.name / solution.name
        if fnmatch.fnmatch(key, pattern) and problem.exists():
            found.append((key, problem, solution.read_text(encoding="utf-8")))
    return found


def bound_for(median_ms: float) -> float:
    """The largest median difference (percent) the issue allows for a kernel of this time."""
    return BOUND_LONG if median_ms >= LONG_KERNEL_MS else BOUND_SHORT


def summarise(key: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One solution's traced and untraced copies: medians, difference, stage seconds, pass."""
    side: dict[str, Any] = {}
    for traced in (True, False):
        mine = [r for r in rows if r["traced"] is traced]
        medians = [r["median_ms"] for r in mine if isinstance(r["median_ms"], (int, float))]
        side["traced" if traced else "untraced"] = {
            "statuses": [r["status"] for r in mine], "medians_ms": medians,
            "median_ms": statistics.median(medians) if medians else None,
            "start_s": round(statistics.median(r["start_s"] for r in mine), 3) if mine else None,
            "compile_s": round(statistics.median(r["compile_s"] for r in mine), 3) if mine else None,
            "trace_sources": sorted({str(r["evidence_source"]) for r in mine})}
    a, b = side["traced"]["median_ms"], side["untraced"]["median_ms"]
    diff = round((a - b) / b * 100, 3) if a and b else None
    return {"key": key, **side, "difference_pct": diff, "bound_pct": bound_for(b) if b else None,
            "within": diff is not None and abs(diff) <= bound_for(b)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--filter", default="level1/[1-9]_*")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("trace_cost.json"))
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.jobs < 1:
        parser.error("--rounds and --jobs must be at least 1")
    from kernelagent.harness import EvalConfig, Evaluator

    found = solutions(args.filter)
    if not found:
        parser.error(f"no solution matches {args.filter!r}")
    # No baselines (only the candidate's own timing is compared; Inductor's compile would double
    # the run), no audits (neither touches the timed loop).
    traced = EvalConfig(audit_share=0.0, audit_wins=False, baselines=False)
    untraced = EvalConfig(audit_share=0.0, audit_wins=False, baselines=False, trace=False, kernel_evidence=False)
    jobs: list[tuple[str, bool, Path, str, Any]] = []
    for r in range(args.rounds):
        for key, problem, source in found:
            pair = [(key, True, problem, f"# traced {r}\n{source}", traced),
                    (key, False, problem, f"# untraced {r}\n{source}", untraced)]
            jobs.extend(pair if r % 2 == 0 else pair[::-1])
    cache = Path(tempfile.mkdtemp(prefix="ka-trace-cost-"))
    started = time.monotonic()
    rows: list[dict[str, Any]] = []

    def report() -> dict[str, Any]:
        """The table from the rows so far (rewritten after each result: a cut run keeps them)."""
        table = [summarise(key, [r for r in rows if r["key"] == key]) for key, _, _ in found]
        out = {"device": fingerprint.get("gpu_name"), "tracer": fingerprint.get("trace"), "rounds": args.rounds,
               "wall_s": round(time.monotonic() - started, 1), "done": len(rows), "of": len(jobs),
               "table": table, "rows": rows, "all_within": all(t["within"] for t in table)}
        args.out.write_text(json.dumps(out, indent=1, default=str) + "\n")
        return out

    with Evaluator(device="cuda", cache_dir=cache, concurrency=args.jobs) as ev:
        fingerprint = ev.fingerprint()
        primed = ev.map([(problem, f"# prime\n{source}", untraced) for _, problem, source in found]
                        + [(problem, f"# prime traced\n{source}", traced) for _, problem, source in found])
        print(f"primed: {[r.status for r in primed]} ({time.monotonic() - started:.0f} s)", flush=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = {pool.submit(ev.evaluate, problem, source, config): (key, is_traced)
                       for key, is_traced, problem, source, config in jobs}
            for future in as_completed(futures):
                key, is_traced = futures[future]
                result = future.result()
                stages = result.stage_seconds or {}
                timing = (result.timings or {}).get("candidate")
                rows.append({"key": key, "traced": is_traced, "status": result.status,
                             "median_ms": getattr(timing, "median_ms", None),
                             "start_s": float(stages.get("start", 0.0)),
                             "compile_s": float(stages.get("compile", 0.0)),
                             "evidence_source": (result.kernel_evidence or {}).get("source")})
                report()
    out = report()
    table = out["table"]
    for t in table:
        print(f"{t['key']}: traced {t['traced']['median_ms']} ms, untraced {t['untraced']['median_ms']} ms, "
              f"difference {t['difference_pct']}% (bound {t['bound_pct']}%) {'ok' if t['within'] else 'MISSED'}; "
              f"start {t['traced']['start_s']}/{t['untraced']['start_s']} s, compile "
              f"{t['traced']['compile_s']}/{t['untraced']['compile_s']} s; "
              f"{t['traced']['statuses']} {t['untraced']['statuses']} {t['traced']['trace_sources']}", flush=True)
    print(f"all within the bounds: {out['all_within']} ({out['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
