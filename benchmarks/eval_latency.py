"""The wait of one evaluation: what an agent turn pays for a verdict, cold and warm.

    python benchmarks/eval_latency.py --out latency.json [--problem benchmarks/level1/5_softmax.py]
        [--solution benchmarks/solutions/level1/5_softmax.py] [--repeats 3] [--no-kernel-evidence]

In one process, with the host's CPU sampled throughout (host_cpu.py):
- `cold`: a fresh Evaluator with an empty cache root (server start, device probe, baselines
  compiled and timed, the evidence session): the first evaluation a new user waits for;
- `warm`: the same server, `--repeats` more evaluations one at a time, each a distinct copy of
  the solution (a comment line makes it differ), baselines cached: an agent turn's wait.

Each row: the verdict, wall seconds, the result's stage seconds (server start, start, load,
compile, correctness, timing, baselines, evidence...), the timing slot's held seconds by part,
and the host CPU-seconds the machine spent meanwhile (every process on it; on a quiet
device machine, the harness's).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from host_cpu import HostCpu, machine_cpu_seconds  # noqa: E402


def row(label: str, result, wall: float, cpu: float) -> dict:
    from kernelagent.harness.server.gate import SLOT_PARTS

    conc = result.concurrency or {}
    return {"label": label, "status": result.status, "wall_s": round(wall, 2), "host_cpu_s": round(cpu, 2),
            "stage_seconds": {k: round(float(v), 2) for k, v in (result.stage_seconds or {}).items()},
            "slot_held_s": round(float(conc.get("held_s", 0.0)), 3),
            "slot_parts_s": {k: round(float(conc.get(k, 0.0)), 3) for k in SLOT_PARTS if conc.get(k)},
            "evidence": {k: v for k, v in (result.kernel_evidence or {}).items() if k != "kernels"},
            "timed_loop": {k: v for k, v in (result.timed_loop or {}).items()
                           if k in ("calls", "segments", "calibration_s", "calibration_reused", "plan_reused",
                                    "calibrations_s", "server_ms_per_call", "claimed_mean_ms", "source")},
            "speedup_compile": result.speedups.get("compile")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problem", type=Path, default=HERE / "level1" / "5_softmax.py")
    parser.add_argument("--solution", type=Path, default=HERE / "solutions" / "level1" / "5_softmax.py")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--no-kernel-evidence", action="store_true")
    parser.add_argument("--cache", type=Path, default=None, help="cache root (default: a fresh empty one)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from kernelagent.harness import EvalConfig, Evaluator

    config = EvalConfig(kernel_evidence=not args.no_kernel_evidence)
    source = args.solution.read_text(encoding="utf-8")
    cache = args.cache or Path(tempfile.mkdtemp(prefix="ka-latency-"))
    rows = []
    with HostCpu() as total:
        with Evaluator(device=args.device, cache_dir=cache) as ev:
            for i in range(args.repeats + 1):
                label = "cold" if i == 0 else f"warm {i}"
                cpu0, t0 = machine_cpu_seconds(), time.monotonic()
                result = ev.evaluate(args.problem, f"# latency sample {i}\n{source}", config)
                r = row(label, result, time.monotonic() - t0, machine_cpu_seconds() - cpu0)
                rows.append(r)
                print(json.dumps(r), flush=True)
    rep = total.report(len(rows), tree=True)
    out = {"problem": str(args.problem), "kernel_evidence": config.kernel_evidence, "rows": rows, "host_cpu": rep}
    warm = [r["wall_s"] for r in rows[1:]]
    if warm:
        out["warm_median_s"] = sorted(warm)[len(warm) // 2]
        out["warm_host_cpu_s_median"] = sorted(r["host_cpu_s"] for r in rows[1:])[len(warm) // 2]
    print(f"cold {rows[0]['wall_s']} s ({rows[0]['host_cpu_s']} CPU-s); warm median {out.get('warm_median_s')} s "
          f"({out.get('warm_host_cpu_s_median')} CPU-s)")
    print("by kind: " + ", ".join(f"{k} {v['cpu_s']}" for k, v in rep["by_kind"].items()))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
