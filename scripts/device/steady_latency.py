"""Issue 59: a bench run's steady state per device, from `bench_throughput.py`'s JSON (its
`timeline.spans`): the evaluations that started after the device's first result, their mean
latency (start to result) and each stage's mean. A server's pace is its jobs at once over this
latency, so a job slower beside another server shows here first.
    python3 scripts/device/steady_latency.py RESULT.json [RESULT.json ...]
"""
from __future__ import annotations

import argparse
import json
import statistics

STAGES = ("start", "compile", "correctness", "timing", "post-check", "evidence")


def rows(path: str) -> list[str]:
    data = json.loads(open(path).read())
    out = []
    for row in data.get("rows", []):
        spans = (row.get("timeline") or {}).get("spans") or []
        for device in sorted({s[0] for s in spans}):
            mine = [s for s in spans if s[0] == device]
            first_end = min(s[3] for s in mine)
            steady = [s for s in mine if s[2] >= first_end]
            if not steady:
                out.append(f"{path} gpus {row.get('gpus')} {device}: {len(mine)} evaluations, "
                           "none after the first result")
                continue
            latency = statistics.mean(s[3] - s[2] for s in steady)
            stages = {k: round(statistics.mean(s[6].get(k, 0.0) for s in steady), 2) for k in STAGES}
            out.append(f"{path} gpus {row.get('gpus')} {device}: {len(mine)} evaluations, {len(steady)} steady, "
                       f"latency {latency:.2f} s, stages {stages}")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="a bench run's steady-state latency per device")
    parser.add_argument("paths", nargs="+")
    for p in parser.parse_args().paths:
        print("\n".join(rows(p)))
