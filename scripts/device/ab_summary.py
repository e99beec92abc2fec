"""Per problem and variant, what an A/B device script's runs read (connections_ab.sh): the
candidate's median time (ms), its speedup over Inductor, the job's start stage (s), and how
many runs were correct, each over the rounds (their median), from the JSON-lines file that
eval_line.py --keep wrote. A run's tag is `round|problem|variant`.
    python3 scripts/device/ab_summary.py RUNS.jsonl
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict


def summarise(lines: list[dict]) -> list[str]:
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for line in lines:
        parts = str(line.get("tag", "")).split("|")
        if len(parts) == 3:
            groups[(parts[1], parts[2])].append(line.get("result") or {})
    out = []
    for (problem, variant), results in sorted(groups.items()):
        correct = [r for r in results if r.get("status") == "correct"]
        med = lambda xs: round(statistics.median(xs), 5) if xs else None  # noqa: E731
        ms = med([r["timings"]["candidate"]["median_ms"] for r in correct if "candidate" in (r.get("timings") or {})])
        speedup = med([r["speedups"]["compile"] for r in correct if "compile" in (r.get("speedups") or {})])
        start = med([r["stage_seconds"]["start"] for r in results if "start" in (r.get("stage_seconds") or {})])
        out.append(f"{problem} {variant}: {len(correct)}/{len(results)} correct, candidate {ms} ms, "
                   f"x{speedup} over Inductor, start {start} s")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", help="the JSON-lines file of eval_line.py --keep")
    args = parser.parse_args()
    with open(args.runs) as f:
        print("\n".join(summarise([json.loads(x) for x in f if x.strip()])))
