"""Throughput of `kernelagent bench --candidates` on 1 GPU, then on 2 GPUs.

Evaluates the Triton solutions under benchmarks/solutions/ against their problems as one
batch, with the full default harness settings (5 trials, timing, eager and torch.compile
baselines), first on GPU 0 alone and then on GPUs 0 and 1. Every measurement gets a fresh
store and a fresh baseline cache, so nothing is skipped or answered from a cache. With
--samples N, each solution is evaluated N times as N distinct candidates (a comment line
makes their content differ), to give the GPUs more work than the problem count.

    python benchmarks/bench_throughput.py --out throughput.json [--samples 2] [--gpu-sets 0 0,1] [--filter 'level1/*']

Prints, per GPU set: evaluations, wall seconds (harness start included), evaluations per
GPU-minute, how many were correct; then the 1 -> 2 GPU speedup and scaling efficiency
(speedup / 2). On a machine with one GPU only the first set runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from kernelagent.bench import BenchSpec, Session, discover, find_candidates, run_bench  # noqa: E402
from kernelagent.bench.store import Store  # noqa: E402
from kernelagent.harness.caller.pool import visible_gpus  # noqa: E402


def build_candidates(target: Path, pattern: str | None, samples: int) -> int:
    """CDIR/<level>/<stem>/sample_<i>.py for every problem with a solution; returns the count."""
    n = 0
    for ref in discover(HERE, pattern=pattern):
        found = find_candidates(HERE / "solutions", ref)
        if not found:
            continue
        source = found[0].read_text(encoding="utf-8")
        folder = target / ref.level / ref.name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(samples):
            (folder / f"sample_{i}.py").write_text(f"# throughput sample {i}\n{source}", encoding="utf-8")
            n += 1
    return n


def measure(gpus: str, cdir: Path, pattern: str | None, work: Path, trials: int) -> dict:
    store = work / f"store-{gpus.replace(',', '_')}.sqlite"
    cache = work / f"cache-{gpus.replace(',', '_')}"
    spec = BenchSpec(root=str(HERE), candidates=str(cdir), filter=pattern, trials=trials)
    started = time.monotonic()
    outcome = run_bench(spec, Session(gpus=gpus, store=str(store), cache_dir=str(cache),
                                      out=str(work / f"run-{gpus.replace(',', '_')}")))
    wall = time.monotonic() - started
    with Store(store) as db:
        log = db.evaluation_log(outcome.run_id)
        attempts = db.attempts(outcome.run_id)
    n_gpus = len(gpus.split(","))
    eval_seconds = sum(r["seconds"] or 0.0 for r in log)
    return {"gpus": gpus, "n_gpus": n_gpus, "evaluations": outcome.evaluations, "reused": outcome.reused,
            "wall_s": round(wall, 2), "evaluations_per_gpu_minute": round(outcome.evaluations / (wall / 60) / n_gpus, 3),
            "evaluations_per_minute": round(outcome.evaluations / (wall / 60), 3),
            "sum_of_evaluation_seconds": round(eval_seconds, 2),
            "correct_samples": sum(1 for a in attempts if a["summary"].get("passed")),
            "statuses": _counts(a["summary"].get("status") for a in attempts),
            "metrics": {k: outcome.metrics[k] for k in ("problems", "correct", "correctness_rate", "fast_p",
                                                         "geomean_speedup")}}


def _counts(values) -> dict:
    out: dict = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="throughput.json")
    parser.add_argument("--samples", type=int, default=2, help="distinct copies of each solution (default 2)")
    parser.add_argument("--gpu-sets", nargs="+", default=["0", "0,1"], help="GPU sets to measure, in order")
    parser.add_argument("--filter", default=None, help="glob over problem keys, e.g. 'level1/*'")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the work folder (stores, reports)")
    args = parser.parse_args()

    visible = visible_gpus()
    sets = [s for s in args.gpu_sets if all(int(i) in visible for i in s.split(","))] if visible else []
    if not sets:
        sys.exit(f"no GPU set of {args.gpu_sets} is visible (visible GPUs: {visible or 'none'})")
    work = Path(tempfile.mkdtemp(prefix="kernelagent-throughput-"))
    try:
        cdir = work / "candidates"
        n = build_candidates(cdir, args.filter, args.samples)
        print(f"{n} candidates ({args.samples} per solution), GPU sets {sets}", flush=True)
        rows = []
        for gpus in sets:
            row = measure(gpus, cdir, args.filter, work, args.trials)
            rows.append(row)
            print(f"GPUs {gpus}: {row['evaluations']} evaluations in {row['wall_s']:.1f} s = "
                  f"{row['evaluations_per_gpu_minute']:.2f} evaluations per GPU-minute "
                  f"({row['evaluations_per_minute']:.2f} per minute); correct {row['correct_samples']}/"
                  f"{row['evaluations'] + row['reused']}; statuses {row['statuses']}",
                  flush=True)
        result = {"candidates": n, "samples": args.samples, "filter": args.filter, "rows": rows}
        one = next((r for r in rows if r["n_gpus"] == 1), None)
        two = next((r for r in rows if r["n_gpus"] == 2), None)
        if one and two:
            speedup = one["wall_s"] / two["wall_s"]
            result["scaling_1_to_2"] = {"speedup": round(speedup, 3), "efficiency": round(speedup / 2, 3)}
            print(f"1 -> 2 GPUs: {speedup:.2f}x faster, scaling efficiency {speedup / 2:.0%}")
        Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"written: {args.out}" + (f"; work folder kept: {work}" if args.keep else ""))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
