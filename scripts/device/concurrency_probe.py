"""Issue 55/59 on the device: the overlapped throughput of one server at several concurrencies, on
the same level-1 candidates and primed caches (benchmarks/overlap.py's run_mode), to choose the
default jobs per device (server/gate.py default_concurrency). Prints one line per concurrency:
evaluations per GPU-minute, the slot's share of the wall, host CPU per evaluation, the first
evaluation's end (the fill) and every verdict.
    python3 scripts/device/concurrency_probe.py --samples 4 --jobs 8 12 16 [--first-wave 0.5 0] --out $OUT/conc.json
With --launch-cover-us 400 200, each concurrency runs under each launch cover (EvalConfig.launch_cover_us,
the spin queued before every timed call): what the covers cost the slot, and whether the same
candidates read the same (every key whose speedup differs by more than 3% between runs is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from overlap import candidates, run_mode  # noqa: E402

from kernelagent.harness import EvalConfig, Evaluator  # noqa: E402


def fill_and_gaps(rows: list[dict]) -> str:
    """Where the slot stood idle: from the first job's start to the first hold (the fill), between
    holds (the gaps, with how many jobs were alive and not yet timed in each), and from the last
    hold's end to the last job's end (the drain); epoch seconds from each job's record."""
    spans = [r["span"] for r in rows if isinstance(r.get("span"), list) and len(r["span"]) == 2]
    holds = sorted(tuple(h) for r in rows for h in (r.get("held") or []) if isinstance(h, list) and len(h) == 2)
    if not spans or not holds:
        return "no spans or holds recorded"
    start, end = min(s[0] for s in spans), max(s[1] for s in spans)
    gaps, merged_end = [], holds[0][1]
    for a, b in holds[1:]:
        if a > merged_end:
            gaps.append(a - merged_end)
        merged_end = max(merged_end, b)
    big = sorted(gaps, reverse=True)[:5]
    return (f"fill {holds[0][0] - start:.2f} s; {len(gaps)} gaps, {sum(gaps):.2f} s in all (largest "
            f"{', '.join(f'{g:.2f}' for g in big)}); drain {end - merged_end:.2f} s; wall by spans {end - start:.2f} s")


def host_shares(rows: list[dict]) -> str:
    """The wall time per call that the device ran none of the candidate's kernels (1 - device/wall,
    the kernel trace's time against the timed median), per candidate: a launch cover too short for
    a candidate's launch shows here first (its wall reads its host's launch, its device time not)."""
    shares: dict[str, list[float]] = {}
    for r in rows:
        wall, device = r.get("median_ms"), r.get("device_ms")
        if isinstance(wall, (int, float)) and isinstance(device, (int, float)) and wall > 0:
            shares.setdefault(r["key"].split("#")[0], []).append(max(0.0, 1.0 - device / wall))
    if not shares:
        return "host share: no row has both clocks"
    return "host share by candidate (median of its copies): " + ", ".join(
        f"{key.split('/')[-1]} {sorted(v)[len(v) // 2]:.1%}" for key, v in sorted(shares.items()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--filter", default="level1/[1-6]_*")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--jobs", type=int, nargs="+", default=[8, 12, 16])
    parser.add_argument("--first-wave", type=float, nargs="+", default=[None],
                        help="KERNELAGENT_FIRST_WAVE_S values to run each concurrency with (server/admission.py)")
    parser.add_argument("--launch-cover-us", type=float, nargs="+", default=[None],
                        help="run each concurrency under each of these launch covers (default: the config's)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    jobs = candidates(args.filter, args.samples)
    config = EvalConfig(trials=5)
    cache = Path(tempfile.mkdtemp(prefix="kernelagent-conc-")) / "cache"
    firsts = {str(p): (k, p, s) for k, p, s in jobs}
    t = time.monotonic()
    with Evaluator(device="cuda", cache_dir=cache) as ev:
        primed = ev.map([(p, s, config) for _, p, s in firsts.values()])
    print(f"primed {len(primed)} in {time.monotonic() - t:.1f} s: {[r.status for r in primed]}", flush=True)
    out = {}
    runs = [(n, wave, cover) for n in args.jobs for wave in args.first_wave for cover in args.launch_cover_us]
    for n, wave, cover in runs:
        if wave is not None:
            os.environ["KERNELAGENT_FIRST_WAVE_S"] = str(wave)
        run_config = config if cover is None else EvalConfig.from_dict({**config.to_dict(), "launch_cover_us": cover})
        m = run_mode("cuda", cache, jobs, run_config, n)
        out[f"{n} {wave} {cover}"] = m
        print(f"jobs {m['concurrency']}, first wave {wave}, launch cover {cover or config.launch_cover_us} us: "
              f"{m['evaluations']} in {m['wall_s']} s = {m['evaluations_per_gpu_minute']}/GPU-min; "
              f"slot {m['slot_held_s']} s ({m['slot_busy_share']}); host CPU {m['host_cpu_s_per_evaluation']}/eval; "
              f"parts {m['slot_parts_s']}; verdicts {dict(Counter(r['status'] for r in m['rows']))}", flush=True)
        print("  " + fill_and_gaps(m["rows"]), flush=True)
        print("  " + host_shares(m["rows"]), flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    for a in zip(*[[(r["key"], r["status"], r["speedup"] and round(r["speedup"], 3)) for r in m["rows"]]
                   for m in out.values()]):
        if len({x[1] for x in a}) > 1 or max(x[2] or 0 for x in a) - min(x[2] or 0 for x in a) > 0.03:
            print("differs:", a)


if __name__ == "__main__":
    main()
