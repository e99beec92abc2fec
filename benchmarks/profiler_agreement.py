"""Does the harness's clock agree with the profiler's? Issue 13, scope 2 (an independent clock).

For every problem of a benchmark directory that has a solution, one evaluation with profiling on
(`EvalConfig(profile=True)`, no baselines) gives two numbers per forward call:
  harness ms   the candidate's median from the harness's timed loop (timings.candidate.median_ms:
               L2 flushed before each call, synchronised, host time included)
  profiler ms  the device time of every kernel torch.profiler saw, summed, per call (3 calls on the
               main inputs in the candidate's process right after the timed loop)
and their difference, the host overhead per call. The target: they agree within 3% for kernels of
50 us or more (harness/caller/profiling.py: clocks, AGREEMENT_PCT, AGREEMENT_MIN_MS).

    python benchmarks/profiler_agreement.py [--suite ours|kernelbench|both] [--problems DIR --solutions DIR]
        [--filter GLOB] [--max-minutes 7] [--jobs 8] [--out agreement.jsonl] [--summary agreement.md]
        [--device auto] [--isolation auto]

One harness server for the whole run (torch and triton are imported once), with `--jobs N`
problems in flight at once (default 8): the server overlaps their host work (imports, compiles,
checks) while each timed loop and each profile holds the device alone (server/gate.py), so the
clocks compared are those of a job alone on the GPU. `--max-minutes` caps the run: no problem
starts once the time spent plus the slowest evaluation so far (its queueing included) would pass
it; the ones left are listed as "not run (time cap)". Each row is appended to `--out` (JSON lines) as
soon as it is measured, with the GPU, driver, torch and triton versions. Needs none of litellm,
openai, tenacity or pydantic (run with PYTHONPATH=.).

On the CPU it runs end to end, but the harness time is the Triton interpreter's and the profiler's
rows are CPU ops: every row says "not meaningful" and no agreement is judged.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from kernelagent.bench.discover import discover, find_candidates  # noqa: E402
from kernelagent.harness.caller import profiling  # noqa: E402


def kernelbench_dir() -> Path:
    """KernelBench's problems: ../shared/kernelbench (beside the checkout) or ./shared/kernelbench."""
    for base in (ROOT.parent / "shared", ROOT / "shared"):
        path = base / "kernelbench" / "KernelBench"
        if path.is_dir():
            return path
    return ROOT.parent / "shared" / "kernelbench" / "KernelBench"


def suites(args: argparse.Namespace) -> list[tuple[str, Path, Path]]:
    if args.problems or args.solutions:
        if not (args.problems and args.solutions):
            raise SystemExit("error: --problems and --solutions go together")
        return [("custom", Path(args.problems), Path(args.solutions))]
    chosen = []
    if args.suite in ("ours", "both"):
        chosen.append(("ours", HERE / "level1", HERE / "solutions"))
    if args.suite in ("kernelbench", "both"):
        chosen.append(("kb", kernelbench_dir(), HERE / "kernelbench_solutions"))
    return chosen


def pairs(args: argparse.Namespace) -> tuple[list[tuple[str, Path, Path]], list[str]]:
    """(label, problem, solution) for every problem that has a solution, and notes on the rest."""
    out, notes = [], []
    for tag, problems, solutions in suites(args):
        if not problems.exists():
            notes.append(f"{tag}: {problems} not found: skipped")
            continue
        for ref in discover(problems):
            label = f"{tag}/{ref.key}"
            if args.filter and not (fnmatch.fnmatch(label, args.filter) or fnmatch.fnmatch(ref.key, args.filter)
                                    or fnmatch.fnmatch(ref.name, args.filter)):
                continue
            found = find_candidates(solutions, ref)
            if found:
                out.append((label, ref.path, found[0]))
    return out, notes


def measure(evaluator, label: str, problem: Path, solution: Path) -> dict:
    from kernelagent.harness import EvalConfig

    started = time.monotonic()
    config = EvalConfig(trials=1, baselines=False, profile=True)
    result = evaluator.evaluate(problem, solution.read_text(), config)
    fp = result.fingerprint or {}
    row = {"problem": label, "status": result.status, "passed": result.passed,
           "gpu": fp.get("gpu_name") or "cpu", "driver": fp.get("driver"), "torch": fp.get("torch"),
           "triton": fp.get("triton"), "python": fp.get("python"), "seconds": round(time.monotonic() - started, 2)}
    clocks = profiling.clocks(result)
    row.update({k: clocks.get(k) for k in ("harness_ms", "harness_source", "profiler_ms", "host_overhead_ms",
                                           "diff_pct", "within_pct", "meaningful", "kind", "kernels", "note")})
    if "unavailable" in clocks:
        row["note"] = clocks["unavailable"]
        row["meaningful"] = False
    if result.status != "correct":
        row["note"] = (result.reason or result.status).strip().splitlines()[0][:200] if result.reason else result.status
    timing = result.timings.get("candidate")
    row["reps"] = timing.reps if timing else None
    span = (result.concurrency or {}).get("span")
    row["span"] = span if isinstance(span, list) and len(span) == 2 else None  # the server's, for overlap
    return row


def fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def verdict(row: dict) -> str:
    if row.get("status") == "not run":
        return "not run (time cap)"
    if not row.get("meaningful"):
        return "not meaningful" + (" (CPU)" if row.get("gpu") == "cpu" else "")
    if row.get("within_pct") is None:
        return "n/a (<50 us)"
    return "yes" if row["within_pct"] else "NO"


def table(rows: list[dict]) -> str:
    gpu = next((r for r in rows if r.get("gpu")), {})
    head = [f"GPU: {gpu.get('gpu', '?')}, driver {gpu.get('driver')}, torch {gpu.get('torch')}, "
            f"triton {gpu.get('triton')}, python {gpu.get('python')}", ""]
    if gpu.get("gpu") == "cpu":
        head += ["NOT MEANINGFUL: no GPU. Harness times are the Triton interpreter's and the profiler's rows are "
                 "CPU ops; no agreement is judged.", ""]
    lines = ["| problem | status | harness ms | profiler ms | diff % | host overhead ms | within 3% (>=50 us) |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['problem']} | {r.get('status')} | {fmt(r.get('harness_ms'), '.4f')} | "
                     f"{fmt(r.get('profiler_ms'), '.4f')} | {fmt(r.get('diff_pct'), '+.1f')} | "
                     f"{fmt(r.get('host_overhead_ms'), '.4f')} | {verdict(r)} |")
    judged = [r for r in rows if r.get("meaningful") and r.get("within_pct") is not None]
    tail = [""]
    if judged:
        ok = sum(1 for r in judged if r["within_pct"])
        tail.append(f"{ok} of {len(judged)} problems of 50 us or more agree within 3%.")
    left = sum(1 for r in rows if r.get("status") == "not run")
    if left:
        tail.append(f"{left} problem(s) not run: the time cap (--max-minutes) was reached.")
    return "\n".join(head + lines + tail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=("ours", "kernelbench", "both"), default="ours",
                        help="ours: benchmarks/level1 with benchmarks/solutions; kernelbench: KernelBench's "
                             "levels with benchmarks/kernelbench_solutions; both")
    parser.add_argument("--problems", help="a benchmark directory (with --solutions), instead of --suite")
    parser.add_argument("--solutions", help="its solutions, in bench's --candidates layout")
    parser.add_argument("--filter", help="glob over the label (ours/level1/5_softmax), the key or the stem")
    parser.add_argument("--max-minutes", type=float, default=7.0)
    parser.add_argument("--jobs", type=int, default=8,
                        help="problems in flight at once, the server admitting as many (1: one after another)")
    parser.add_argument("--out", type=Path, help="JSON lines, one per problem, appended as measured")
    parser.add_argument("--summary", type=Path, help="write the Markdown table here too")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--isolation", default="auto")
    args = parser.parse_args(argv)
    if not args.max_minutes > 0:
        parser.error("--max-minutes must be > 0")
    if not 1 <= args.jobs <= 64:
        parser.error("--jobs must be 1 to 64")
    todo, notes = pairs(args)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if not todo:
        print("error: no problem with a solution was selected", file=sys.stderr)
        return 2
    from kernelagent.harness import Evaluator

    started = time.monotonic()
    cap = args.max_minutes * 60.0
    rows: list[dict | None] = [None] * len(todo)
    slowest = 0.0
    out = args.out.open("a") if args.out else None
    try:
        with Evaluator(device=args.device, isolation=args.isolation, concurrency=args.jobs) as evaluator, \
                ThreadPoolExecutor(max_workers=args.jobs) as pool:
            queue = list(enumerate(todo))
            pending: dict = {}
            while queue or pending:
                while queue and len(pending) < args.jobs and not (
                        any(rows) and time.monotonic() - started + slowest > cap):
                    i, (label, problem, solution) = queue.pop(0)
                    pending[pool.submit(measure, evaluator, label, problem, solution)] = i
                if not pending:
                    break
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    row = rows[pending.pop(future)] = future.result()
                    slowest = max(slowest, row["seconds"])
                    print(f"{row['problem']}: {row['status']} harness {fmt(row.get('harness_ms'), '.4f')} ms, "
                          f"profiler {fmt(row.get('profiler_ms'), '.4f')} ms ({row['seconds']:.1f} s)",
                          file=sys.stderr, flush=True)
                    if out is not None:
                        out.write(json.dumps(row) + "\n")
                        out.flush()
            for i, (label, _, _) in queue:
                rows[i] = {"problem": label, "status": "not run"}
    finally:
        if out is not None:
            out.close()
    text = table(rows)
    print(text)
    if args.summary:
        args.summary.write_text(text + "\n")
    print(f"wall: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
