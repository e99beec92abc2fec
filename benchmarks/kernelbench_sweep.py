"""KernelBench on the GPU with our known-good solutions: verdicts, memory, wall time, speedups.

Runs `kernelagent bench KB --levels 1,2,3 --candidates benchmarks/kernelbench_solutions` (the
same run_bench, store and harness as the CLI) and, as each problem finishes, writes one JSON
row for it to --out (JSON lines, so a run cut short keeps what it had):

    verdict, passed, reason, flags, input set, peak device memory of the reference and the
    candidate processes over the problem's input+output bytes (the result's `memory` field),
    wall time of every stage, the candidate's median time, speedups over eager and Inductor.

At the end it prints a summary line and a Markdown table of every evaluated problem.

    python benchmarks/kernelbench_sweep.py --out kb_sweep.jsonl [--kb ../shared/kernelbench/KernelBench]
        [--levels 1,2,3] [--filter 'level1/*'] [--gpus 0] [--trials 5] [--store PATH] [--with-missing]

Targets (issue 12): zero false rejections (every solution here is known to be correct, so any
verdict but a pass is the harness's error), and peak memory at most 3.5x the problem's bytes in
every process. The problem's bytes are its inputs and outputs plus the model's parameters and
buffers (a level-3 MLP's 8 GiB of weights sit in both processes whatever the harness does); the
"peak/IO" columns divide by that sum.
Problems without a solution are counted but get no row unless --with-missing; skipped ones
(a missing package, too large for the device) get a row with their reason.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from kernelagent.bench import BenchSpec, Session, run_bench  # noqa: E402
from kernelagent.bench.progress import BenchProgress  # noqa: E402
from kernelagent.bench.store import Store  # noqa: E402

STAGES = ("start", "load", "compile", "correctness", "timing", "post-check", "baselines", "total")
MEMORY_LIMIT = 3.5  # peak / (inputs + outputs), per process


def _ratio(peak, io) -> float | None:
    try:
        return round(float(peak) / float(io), 3) if peak is not None and io else None
    except (TypeError, ValueError):
        return None


def row_for(key: str, record: dict, result: dict | None) -> dict:
    """One problem's row from its bench record and (when it was evaluated) its full result."""
    result = result or {}
    memory = result.get("memory") or {}  # read defensively: the field's keys may grow
    io = memory.get("io_bytes")
    params = memory.get("param_bytes") or 0
    # The memory plan's denominator: the problem's own bytes, its inputs and outputs and the
    # model's parameters (which both processes hold, whatever the harness does).
    problem_bytes = io + params if io else None
    peak_ref = memory.get("peak_reference_bytes")
    peak_cand = memory.get("peak_candidate_bytes")
    stages = result.get("stage_seconds") or {}
    timings = result.get("timings") or {}
    cand = timings.get("candidate") or {}
    return {
        "problem": key,
        "verdict": record.get("status"),
        "passed": bool(record.get("correct")),
        "reason": (record.get("reason") or "")[:300],
        "flags": record.get("flags") or [],
        "input_set": result.get("input_set"),
        "io_bytes": io,
        "peak_reference_bytes": peak_ref,
        "peak_candidate_bytes": peak_cand,
        "param_bytes": params,
        "peak_over_io_reference": _ratio(peak_ref, problem_bytes),
        "peak_over_io_candidate": _ratio(peak_cand, problem_bytes),
        "memory": memory,
        "stage_seconds": {s: round(float(stages[s]), 3) for s in STAGES if stages.get(s) is not None},
        "wall_s": record.get("wall_s"),
        "candidate_ms": cand.get("median_ms"),
        "speedup_eager": record.get("speedup_eager"),
        "speedup_inductor": record.get("speedup_inductor"),
        "device": result.get("device"),
    }


class SweepProgress(BenchProgress):
    """The bench's line progress, plus one row per finished problem written at once."""

    def __init__(self, out: Path, store_path: Path, with_missing: bool):
        super().__init__(quiet=False, live=False)
        self.out, self.store_path, self.with_missing = out, store_path, with_missing
        self.rows: list[dict] = []
        self.counts = {"missing": 0}
        self._write_lock = threading.Lock()
        out.write_text("")

    def _result(self, key: str) -> dict | None:
        with Store(self.store_path) as store:
            attempts = [a for a in store.attempts(self.run_id, key) if a.get("eval_key")]
            if not attempts:
                return None
            hit = store.lookup([attempts[-1]["eval_key"]])
            return hit[1] if hit else None

    def problem_finished(self, key: str, record: dict, counted: bool = True) -> None:
        super().problem_finished(key, record, counted)
        if record.get("status") == "missing":
            self.counts["missing"] += 1
            if not self.with_missing:
                return
        row = row_for(key, record, self._result(key))
        with self._write_lock:
            self.rows.append(row)
            with self.out.open("a") as f:
                f.write(json.dumps(row, default=str) + "\n")


def _fmt(v, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if v is None else f"{v:{spec}}{suffix}"


def table(rows: list[dict]) -> str:
    head = ("| problem | verdict | peak/IO ref | peak/IO cand | wall s | compile s | timing s | baselines s "
            "| vs eager | vs inductor |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        st = r["stage_seconds"]
        lines.append(f"| {r['problem']} | {r['verdict']} | {_fmt(r['peak_over_io_reference'])} | "
                     f"{_fmt(r['peak_over_io_candidate'])} | {_fmt(r['wall_s'], '.1f')} | "
                     f"{_fmt(st.get('compile'), '.1f')} | {_fmt(st.get('timing'), '.1f')} | "
                     f"{_fmt(st.get('baselines'), '.1f')} | {_fmt(r['speedup_eager'], '.2f', 'x')} | "
                     f"{_fmt(r['speedup_inductor'], '.2f', 'x')} |")
    return "\n".join(lines)


def summary(rows: list[dict], missing: int, wall: float) -> dict:
    skipped = [r for r in rows if r["verdict"] in ("skipped", "too_large")]
    evaluated = [r for r in rows if r not in skipped and r["verdict"] != "missing"]
    failed = [r["problem"] for r in evaluated if not r["passed"]]
    ratios = [x for r in evaluated for x in (r["peak_over_io_reference"], r["peak_over_io_candidate"])
              if x is not None]
    over = sorted({r["problem"] for r in evaluated
                   for x in (r["peak_over_io_reference"], r["peak_over_io_candidate"])
                   if x is not None and x > MEMORY_LIMIT})

    def geo(field: str) -> float | None:
        values = [r[field] for r in evaluated if r[field]]
        return math.exp(sum(map(math.log, values)) / len(values)) if values else None

    return {"evaluated": len(evaluated), "passed": len(evaluated) - len(failed), "false_rejections": failed,
            "skipped": [(r["problem"], r["reason"]) for r in skipped], "missing": missing,
            "max_peak_over_io": max(ratios) if ratios else None, "over_memory_limit": over,
            "memory_reported": sum(1 for r in evaluated if r["io_bytes"]),
            "geomean_speedup_eager": geo("speedup_eager"), "geomean_speedup_inductor": geo("speedup_inductor"),
            "median_wall_s": sorted(r["wall_s"] or 0 for r in evaluated)[len(evaluated) // 2] if evaluated else None,
            "devices": sorted({str(r["device"]) for r in evaluated if r["device"]}), "sweep_wall_s": round(wall, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kb", type=Path, default=HERE.parent.parent / "shared" / "kernelbench" / "KernelBench")
    parser.add_argument("--candidates", type=Path, default=HERE / "kernelbench_solutions")
    parser.add_argument("--levels", default="1,2,3")
    parser.add_argument("--filter", default=None)
    parser.add_argument("--gpus", default=None, help="as bench --gpus (default: every visible GPU)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--store", type=Path, default=None, help="bench store (default: a fresh temporary one)")
    parser.add_argument("--out", type=Path, default=Path("kb_sweep.jsonl"))
    parser.add_argument("--with-missing", action="store_true", help="rows for problems without a solution too")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="kb-sweep-") as tmp:
        # A fresh store by default: every evaluation runs (none answered from an earlier run).
        store = args.store or Path(tmp) / "bench.sqlite"
        spec = BenchSpec(root=str(args.kb), candidates=str(args.candidates), levels=args.levels, filter=args.filter,
                         trials=args.trials)
        session = Session(gpus=args.gpus, store=str(store), out=str(Path(tmp) / "run"))
        progress = SweepProgress(args.out, store, args.with_missing)
        started = time.monotonic()
        outcome = run_bench(spec, session, progress=progress)
        wall = time.monotonic() - started
        rows = sorted(progress.rows, key=lambda r: r["problem"])
        result = summary(rows, progress.counts["missing"], wall)
        out_summary = args.out.with_suffix(".summary.json")
        out_summary.write_text(json.dumps({"summary": result, "metrics": outcome.metrics, "rows": rows},
                                          indent=1, default=str))
    print(table(rows))
    rejected = f" {result['false_rejections']}" if result["false_rejections"] else ""
    print(f"kernelbench sweep on {', '.join(result['devices']) or 'no device'}: {result['passed']}/"
          f"{result['evaluated']} solutions passed, false rejections {len(result['false_rejections'])}{rejected}, "
          f"skipped {len(result['skipped'])}, no solution {result['missing']}; peak/IO max "
          f"{_fmt(result['max_peak_over_io'])} (memory reported for {result['memory_reported']}, over "
          f"{MEMORY_LIMIT}x: {result['over_memory_limit'] or 'none'}); geomean vs eager "
          f"{_fmt(result['geomean_speedup_eager'], '.2f', 'x')}, vs inductor "
          f"{_fmt(result['geomean_speedup_inductor'], '.2f', 'x')}; median wall per evaluation "
          f"{_fmt(result['median_wall_s'], '.1f', ' s')}, sweep {result['sweep_wall_s']} s; rows: {args.out}")
    return 0 if not result["false_rejections"] and not result["over_memory_limit"] else 1


if __name__ == "__main__":
    sys.exit(main())
