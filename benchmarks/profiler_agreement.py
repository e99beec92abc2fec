"""Does the harness's clock agree with the profiler's? Issue 13, scope 2 (an independent clock).

For every problem of a benchmark directory that has a solution, one evaluation with profiling on
(`EvalConfig(profile=True)`, no baselines) gives two numbers per forward call:
  harness ms   the candidate's median from the harness's timed loop (timings.candidate.median_ms:
               L2 flushed before each call, synchronised, host time included)
  profiler ms  the device time of every kernel torch.profiler saw, summed, per call (3 calls on the
               main inputs in the candidate's process right after the timed loop)
and their difference, the host overhead per call; and a third clock, Nsight Compute's
  ncu ms       gpu__time_duration of every kernel, summed per call (the kernel evidence's ncu run,
               outside the candidate's process: caches flushed before each kernel, clocks as they are)
which explains a miss when it agrees with the harness and not with the profiler. The target: the
first two agree within 3% for kernels of 50 us or more (harness/caller/profiling.py: clocks,
AGREEMENT_PCT, AGREEMENT_MIN_MS).

    python benchmarks/profiler_agreement.py [--suite ours|kernelbench|both] [--problems DIR --solutions DIR]
        [--filter GLOB] [--max-minutes 7] [--jobs 8] [--out agreement.jsonl] [--summary agreement.md]
        [--device auto] [--isolation auto]

One harness server for the whole run (torch and triton are imported once), with `--jobs N`
problems in flight at once (default 8): the server overlaps their host work (imports, compiles,
checks) while each timed loop and each profile holds the device alone (server/gate.py), so the
clocks compared are those of a job alone on the GPU. The first pass runs without the kernel
evidence (its ncu sessions run one at a time on a host, ~5 s each); each miss is then evaluated
again with it (`--third-clock misses`), in the last `--third-share` of the time. `--max-minutes`
caps the run: no evaluation starts once the time spent plus the median evaluation so far (its wait
included) would pass its pass's share; the problems left are listed as "not run (time cap)", and
Ctrl-C prints the table of what was measured. Each row is appended to `--out` (JSON lines) as soon
as it is measured, with the GPU, driver, torch and triton versions. Needs none of litellm,
openai, tenacity or pydantic (run with PYTHONPATH=.).

On the CPU it runs end to end, but the harness time is the Triton interpreter's and the profiler's
rows are CPU ops: every row says "not meaningful" and no agreement is judged.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from kernelagent.bench.discover import discover, find_candidates  # noqa: E402
from kernelagent.harness.caller import profiling  # noqa: E402
from kernelagent.harness.caller.profiling import AGREEMENT_PCT  # noqa: E402


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


def measure(evaluator, label: str, problem: Path, solution: Path, evidence: bool = False) -> dict:
    from kernelagent.harness import EvalConfig

    started = time.monotonic()
    config = EvalConfig(trials=1, baselines=False, profile=True, kernel_evidence=evidence)
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
    # The third clock: Nsight Compute's gpu__time_duration of every kernel, summed per call (the
    # kernel evidence's ncu run, outside the candidate's process, on every correct GPU result).
    evidence = result.kernel_evidence or {}
    row["ncu_ms"] = evidence.get("per_call_ms")
    row["ncu_note"] = None if row["ncu_ms"] is not None else str(evidence.get("unavailable") or "not collected")[:200]
    for name in ("harness", "profiler"):
        ms = row.get(f"{name}_ms")
        row[f"{name}_vs_ncu_pct"] = (100.0 * (ms - row["ncu_ms"]) / row["ncu_ms"]
                                     if ms is not None and row["ncu_ms"] else None)
    timing = result.timings.get("candidate")
    row["reps"] = timing.reps if timing else None
    span = (result.concurrency or {}).get("span")
    row["span"] = span if isinstance(span, list) and len(span) == 2 else None  # the server's, for overlap
    concurrency = result.concurrency or {}
    row["retried_alone"] = bool(concurrency.get("retried_alone"))
    # the allocator gave memory back while timed work ran (a full device): on the first try beside
    # others (which had it re-run alone) and on the run that counts
    row["alloc_retries"] = {"first_try": concurrency.get("first_try_alloc_retries"),
                            "counted": concurrency.get("alloc_retries")}
    return row


def third_clock(evaluator, row: dict, problem: Path, solution: Path) -> dict:
    """A second evaluation of a miss, with the kernel evidence's ncu run: its three clocks side by
    side (the first evaluation's verdict stands; this one only says why it missed, or that it did
    not repeat)."""
    again = measure(evaluator, row["problem"], problem, solution, evidence=True)
    return {k: again.get(k) for k in ("status", "harness_ms", "profiler_ms", "diff_pct", "within_pct", "ncu_ms",
                                      "ncu_note", "harness_vs_ncu_pct", "profiler_vs_ncu_pct", "seconds",
                                      "retried_alone")}


def fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def verdict(row: dict) -> str:
    if row.get("status") == "not run":
        return "not run (time cap)"
    if not row.get("meaningful"):
        return "not meaningful" + (" (CPU)" if row.get("gpu") == "cpu" else "")
    if row.get("within_pct") is None:
        return "n/a (<50 us)"
    if row["within_pct"]:
        return "yes"
    return "no: " + explain(row)


def explain(row: dict) -> str:
    """A miss, explained by the third clock or said to be unexplained. The clocks come from a second
    evaluation with the kernel evidence's ncu run (`third`), or from the row itself where it had
    one. Where ncu's kernel time agrees with the harness within the target and not with the
    profiler, the profiler's reading is the odd one out (not the harness's); a miss that the second
    evaluation does not repeat, and anything else, is unexplained."""
    third = row.get("third") or row
    if third is not row and third.get("within_pct"):
        return f"UNEXPLAINED: did not repeat (a second evaluation read {fmt(third.get('diff_pct'), '+.1f')}%)"
    to_harness, to_profiler = third.get("harness_vs_ncu_pct"), third.get("profiler_vs_ncu_pct")
    if to_harness is None or to_profiler is None:
        return "UNEXPLAINED (no ncu clock: " + str(third.get("ncu_note") or "?")[:80] + ")"
    if abs(to_harness) <= AGREEMENT_PCT < abs(to_profiler):
        return f"explained: ncu agrees with the harness ({to_harness:+.1f}%), the profiler reads {to_profiler:+.1f}%"
    return f"UNEXPLAINED (harness {to_harness:+.1f}%, profiler {to_profiler:+.1f}% of ncu)"


def explained(row: dict) -> bool:
    return verdict(row).startswith("no: explained")


def table(rows: list[dict]) -> str:
    gpu = next((r for r in rows if r.get("gpu")), {})
    head = [f"GPU: {gpu.get('gpu', '?')}, driver {gpu.get('driver')}, torch {gpu.get('torch')}, "
            f"triton {gpu.get('triton')}, python {gpu.get('python')}", ""]
    if gpu.get("gpu") == "cpu":
        head += ["NOT MEANINGFUL: no GPU. Harness times are the Triton interpreter's and the profiler's rows are "
                 "CPU ops; no agreement is judged.", ""]
    lines = ["| problem | status | harness ms | profiler ms | diff % | host overhead ms | "
             "third clock: harness / profiler / ncu ms | within 3% (>=50 us) |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        t = r.get("third") or (r if r.get("ncu_ms") is not None else None)
        third = "–" if t is None else (f"{fmt(t.get('harness_ms'), '.4f')} / {fmt(t.get('profiler_ms'), '.4f')} / "
                                       f"{fmt(t.get('ncu_ms'), '.4f')}")
        lines.append(f"| {r['problem']} | {r.get('status')} | {fmt(r.get('harness_ms'), '.4f')} | "
                     f"{fmt(r.get('profiler_ms'), '.4f')} | {fmt(r.get('diff_pct'), '+.1f')} | "
                     f"{fmt(r.get('host_overhead_ms'), '.4f')} | {third} | {verdict(r)} |")
    judged = [r for r in rows if r.get("meaningful") and r.get("within_pct") is not None]
    tail = [""]
    if judged:
        ok = sum(1 for r in judged if r["within_pct"])
        why = sum(1 for r in judged if explained(r))
        tail.append(f"{ok} of {len(judged)} problems of 50 us or more agree within 3%; of the "
                    f"{len(judged) - ok} misses, {why} explained by the third clock (ncu agrees with the harness) "
                    f"and {len(judged) - ok - why} unexplained.")
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
    parser.add_argument("--third-clock", choices=("misses", "off"), default="misses",
                        help="misses: evaluate each miss again with the kernel evidence's ncu run (the third "
                             "clock), after the first pass; off: no second evaluation")
    parser.add_argument("--third-share", type=float, default=0.2,
                        help="the share of --max-minutes kept for the third clock's pass (default 0.2)")
    args = parser.parse_args(argv)
    if not 0 <= args.third_share < 1:
        parser.error("--third-share must be in [0, 1)")
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
    out = args.out.open("a") if args.out else None

    def write(row: dict) -> None:
        if out is not None:
            out.write(json.dumps(row) + "\n")
            out.flush()

    def run_pass(items: list[tuple[int, tuple[str, Path, Path]]], work, what: str, until: float) -> list[int]:
        """Up to --jobs evaluations in flight; a new one starts while the time spent plus the
        median evaluation so far (its wait included) stays within `until` seconds. The indices
        left are returned."""
        queue, pending, seconds = list(items), {}, []
        while queue or pending:
            while queue and len(pending) < args.jobs and not (
                    seconds and time.monotonic() - started + statistics.median(seconds) > until):
                i, item = queue.pop(0)
                pending[pool.submit(work, i, *item)] = i
            if not pending:
                break
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                i = pending.pop(future)
                row = future.result()
                seconds.append(row["seconds"])
                print(f"{what} {row.get('problem', todo[i][0])}: {row['status']} harness "
                      f"{fmt(row.get('harness_ms'), '.4f')} ms, profiler {fmt(row.get('profiler_ms'), '.4f')} ms"
                      + (f", ncu {fmt(row.get('ncu_ms'), '.4f')} ms" if what == "third clock" else "")
                      + f" ({row['seconds']:.1f} s)", file=sys.stderr, flush=True)
        return [i for i, _ in queue]

    def first(i: int, label: str, problem: Path, solution: Path) -> dict:
        rows[i] = row = measure(evaluator, label, problem, solution)
        write(row)
        return row

    def second(i: int, label: str, problem: Path, solution: Path) -> dict:
        row = rows[i]
        row["third"] = third_clock(evaluator, row, problem, solution)
        write({"problem": label, "third": row["third"]})
        return dict(row["third"], problem=label)

    try:
        with Evaluator(device=args.device, isolation=args.isolation, concurrency=args.jobs) as evaluator, \
                ThreadPoolExecutor(max_workers=args.jobs) as pool:
            # The first pass, every problem, without the kernel evidence (its ncu runs one at a
            # time on the host, ~5 s each of them); the third clock only for the misses, after.
            reserve = cap * args.third_share if args.third_clock == "misses" else 0.0
            left = run_pass(list(enumerate(todo)), first, "first", cap - reserve)
            for i in left:
                rows[i] = {"problem": todo[i][0], "status": "not run"}
            if args.third_clock == "misses":
                misses = [(i, todo[i]) for i, r in enumerate(rows)
                          if r and r.get("meaningful") and r.get("within_pct") is False]
                for i in run_pass(misses, second, "third clock", cap):
                    rows[i]["third"] = {"status": "not run", "ncu_note": "time cap"}
    except KeyboardInterrupt:
        print("interrupted: the table below has what was measured", file=sys.stderr)
        rows = [r if r is not None else {"problem": todo[i][0], "status": "not run"} for i, r in enumerate(rows)]
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
