"""Where the harness's wall time goes, per candidate.

For every known-good solution under benchmarks/solutions/, evaluates it twice with the full
default settings: once cold (an empty baseline cache: eager and torch.compile are timed and
compiled) and once with the baselines cached. Prints each stage's wall time and writes the
rows, with the GPU and library versions, as JSON.

    python benchmarks/harness_overhead.py --out overhead.json [--filter 'level1/*'] [--device cuda] [--no-defences]

Target (issue 2): a level-1 candidate with cached baselines is fully evaluated in < 5 s wall.
On the CPU the script runs too, but its figures are those of the Triton interpreter.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from kernelagent.harness import EvalConfig, Evaluator  # noqa: E402

STAGES = ("start", "load", "compile", "correctness", "timing", "post-check", "profile", "baselines")


def solution_pairs(pattern: str) -> list[tuple[Path, Path]]:
    pairs = []
    for solution in sorted((HERE / "solutions").glob("level*/*.py")):
        key = f"{solution.parent.name}/{solution.stem}"
        if fnmatch.fnmatch(key, pattern):
            pairs.append((HERE / solution.parent.name / solution.name, solution))
    return pairs


def row_for(name: str, phase: str, result, wall: float) -> dict:
    secs = result.stage_seconds
    return {
        "problem": name, "phase": phase, "status": result.status, "wall_s": round(wall, 3),
        **{f"{s}_s": round(secs.get(s, 0.0), 3) for s in STAGES},
        "baselines_cached": result.baselines_cached,
        "candidate_ms": result.timings["candidate"].median_ms if "candidate" in result.timings else None,
        "speedup_eager": result.speedups.get("eager"),
        "speedup_compile": result.speedups.get("compile"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--filter", default="*", help="glob over level/stem, e.g. 'level1/*'")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-defences", action="store_true",
                        help="turn the reward-hacking defences off (EvalConfig.defences=False), for before/after")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as cache:
        started = time.perf_counter()
        evaluator = Evaluator(device=args.device, cache_dir=cache)
        fingerprint = evaluator.fingerprint()
        server_start_s = time.perf_counter() - started
        print(f"device: {fingerprint.get('gpu_name', 'cpu')}  torch {fingerprint.get('torch')}  "
              f"triton {fingerprint.get('triton')}  python {fingerprint.get('python')}")
        print(f"harness server start (imports + device probe): {server_start_s:.2f} s")
        if not fingerprint.get("cuda"):
            print("NOTE: no GPU: every figure below is the Triton interpreter's and means nothing for speed")
        header = f"{'problem':38} {'phase':6} {'status':8} {'wall':>6} " + " ".join(f"{s[:8]:>8}" for s in STAGES)
        print(header)
        try:
            for problem, solution in solution_pairs(args.filter):
                name = f"{solution.parent.name}/{solution.stem}"
                source = solution.read_text()
                for phase in ("cold", "cached"):
                    t0 = time.perf_counter()
                    result = evaluator.evaluate(problem, source, EvalConfig(trials=args.trials, defences=not args.no_defences))
                    row = row_for(name, phase, result, time.perf_counter() - t0)
                    rows.append(row)
                    print(f"{name:38} {phase:6} {row['status'][:8]:8} {row['wall_s']:6.2f} "
                          + " ".join(f"{row[s + '_s']:8.2f}" for s in STAGES), flush=True)
        finally:
            evaluator.close()

    cached_l1 = [r["wall_s"] for r in rows if r["phase"] == "cached" and r["problem"].startswith("level1")]
    cached_all = [r["wall_s"] for r in rows if r["phase"] == "cached"]
    summary = {
        "device": fingerprint.get("gpu_name", "cpu"),
        "fingerprint": fingerprint,
        "server_start_s": round(server_start_s, 3),
        "cached_level1_median_s": round(statistics.median(cached_l1), 3) if cached_l1 else None,
        "cached_level1_max_s": round(max(cached_l1), 3) if cached_l1 else None,
        "cached_all_median_s": round(statistics.median(cached_all), 3) if cached_all else None,
        "target_s": 5.0,
        "defences": not args.no_defences,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "fingerprint"}))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
