"""Where the harness's wall time goes, per candidate.

For every known-good solution under benchmarks/solutions/, evaluates it twice with the full
default settings: once cold (an empty baseline cache: eager and torch.compile are timed and
compiled) and once with the baselines cached. Prints each stage's wall time and writes the
rows, with the GPU and library versions, as JSON.

    python benchmarks/harness_overhead.py --out overhead.json [--filter 'level1/*'] [--device cuda]
                                          [--defences on|off|both] [--repeats 3]

Targets: a level-1 candidate with cached baselines is fully evaluated in < 5 s wall (issue 2),
and the reward-hacking defences add at most 25% to that wall time (issue 4). `--defences both`
measures the second in one run: after the cold evaluation, each problem is evaluated
`--repeats` times with the defences on and off, interleaved, and the summary gives the
ratio of the median walls per problem and over all problems.
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


def print_row(row: dict) -> None:
    print(f"{row['problem']:34} {row['phase']:6} {row['defences']:4} {row['status'][:8]:8} {row['wall_s']:6.2f} "
          + " ".join(f"{row[s + '_s']:8.2f}" for s in STAGES), flush=True)


def defence_ratios(rows: list[dict]) -> dict:
    """Median cached wall with the defences on and off, per problem and over all of them."""
    per_problem = {}
    for name in dict.fromkeys(r["problem"] for r in rows):
        on = [r["wall_s"] for r in rows if r["problem"] == name and r["phase"] == "cached" and r["defences"] == "on"]
        off = [r["wall_s"] for r in rows if r["problem"] == name and r["phase"] == "cached" and r["defences"] == "off"]
        if on and off:
            m_on, m_off = statistics.median(on), statistics.median(off)
            stages = {}
            for stage in STAGES:
                s_on = statistics.median(r[stage + "_s"] for r in rows if r["problem"] == name
                                         and r["phase"] == "cached" and r["defences"] == "on")
                s_off = statistics.median(r[stage + "_s"] for r in rows if r["problem"] == name
                                          and r["phase"] == "cached" and r["defences"] == "off")
                if s_on or s_off:
                    stages[stage] = [round(s_off, 3), round(s_on, 3)]
            per_problem[name] = {"off_s": round(m_off, 3), "on_s": round(m_on, 3),
                                 "ratio": round(m_on / m_off, 3), "stages_off_on_s": stages}
    if not per_problem:
        return {}
    all_on = statistics.median(v["on_s"] for v in per_problem.values())
    all_off = statistics.median(v["off_s"] for v in per_problem.values())
    geomean = statistics.geometric_mean(v["ratio"] for v in per_problem.values())
    return {"per_problem": per_problem, "median_off_s": round(all_off, 3), "median_on_s": round(all_on, 3),
            "ratio_of_medians": round(all_on / all_off, 3), "geomean_ratio": round(geomean, 3),
            "target_ratio": 1.25}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--filter", default="*", help="glob over level/stem, e.g. 'level1/*'")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--defences", choices=("on", "off", "both"), default="on",
                        help="the reward-hacking defences (EvalConfig.defences); 'both' compares them in one run")
    parser.add_argument("--no-defences", action="store_true", help="the same as --defences off")
    parser.add_argument("--repeats", type=int, default=None,
                        help="cached evaluations per problem and setting (default 1; 3 with --defences both)")
    args = parser.parse_args()
    if args.no_defences:
        args.defences = "off"
    settings = ("on", "off") if args.defences == "both" else (args.defences,)
    repeats = args.repeats or (3 if args.defences == "both" else 1)

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
        header = f"{'problem':34} {'phase':6} {'def':4} {'status':8} {'wall':>6} " + " ".join(f"{s[:8]:>8}" for s in STAGES)
        print(header)
        try:
            for problem, solution in solution_pairs(args.filter):
                name = f"{solution.parent.name}/{solution.stem}"
                source = solution.read_text()
                plan = [("cold", settings[0])] + [("cached", d) for _ in range(repeats) for d in settings]
                for phase, defences in plan:
                    t0 = time.perf_counter()
                    result = evaluator.evaluate(problem, source, EvalConfig(trials=args.trials,
                                                                            defences=defences == "on"))
                    row = row_for(name, phase, result, time.perf_counter() - t0)
                    row["defences"] = defences
                    rows.append(row)
                    print_row(row)
                    if args.out:  # after every row: a run cut short keeps what it measured
                        args.out.write_text(json.dumps({"summary": None, "rows": rows}, indent=1))
        finally:
            evaluator.close()

    cached_l1 = [r["wall_s"] for r in rows if r["phase"] == "cached" and r["problem"].startswith("level1")
                 and r["defences"] == settings[0]]
    cached_all = [r["wall_s"] for r in rows if r["phase"] == "cached" and r["defences"] == settings[0]]
    summary = {
        "device": fingerprint.get("gpu_name", "cpu"),
        "fingerprint": fingerprint,
        "server_start_s": round(server_start_s, 3),
        "cached_level1_median_s": round(statistics.median(cached_l1), 3) if cached_l1 else None,
        "cached_level1_max_s": round(max(cached_l1), 3) if cached_l1 else None,
        "cached_all_median_s": round(statistics.median(cached_all), 3) if cached_all else None,
        "target_s": 5.0,
        "defences": args.defences,
    }
    # A "cached" row whose baselines were timed again (a baseline error keeps them out of the
    # cache) measures the baselines too: the ratio would be meaningless, so say so.
    recomputed = [f"{r['problem']} ({r['defences']})" for r in rows
                  if r["phase"] == "cached" and not r["baselines_cached"] and r["status"] == "correct"]
    summary["cached_rows_without_cache"] = len(recomputed)
    if recomputed:
        print(f"WARNING: {len(recomputed)} 'cached' evaluations timed their baselines again (not cached): "
              + ", ".join(recomputed[:5]))
    if args.defences == "both":
        overhead = summary["defences_overhead"] = defence_ratios(rows)
        print(f"\n{'problem':34} {'off s':>7} {'on s':>7} {'on/off':>7}   stage seconds off->on")
        for name, v in overhead.get("per_problem", {}).items():
            stages = "  ".join(f"{k} {a:.2f}->{b:.2f}" for k, (a, b) in v["stages_off_on_s"].items())
            print(f"{name:34} {v['off_s']:7.2f} {v['on_s']:7.2f} {v['ratio']:7.3f}   {stages}")
        if overhead:
            print(f"{'all (medians)':34} {overhead['median_off_s']:7.2f} {overhead['median_on_s']:7.2f} "
                  f"{overhead['ratio_of_medians']:7.3f}   geomean of ratios {overhead['geomean_ratio']:.3f} "
                  f"(target <= {overhead['target_ratio']})")
    print(json.dumps({k: v for k, v in summary.items() if k not in ("fingerprint", "defences_overhead")}))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
