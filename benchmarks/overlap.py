"""Serial against overlapped evaluation on one device, in one call (bench_throughput.py --overlap).

The same candidates (every solution under benchmarks/solutions/ matching --filter, --samples
distinct copies of each) are evaluated twice through one Evaluator each: first one job at a time
(concurrency 1), then several at once (the server's default, or --jobs). The baseline cache is
primed first (one uncounted evaluation per problem), so both modes divide by the same baselines.
Then one candidate is evaluated beside hostile neighbours (tests/adversarial/n1_spinner_neighbour.py,
which keeps the device busy from import on).

Reported: evaluations per GPU-minute in each mode and their ratio; every candidate's verdict in
both modes (they must be identical); its speedup over Inductor with the 95% interval in both
modes and whether the intervals overlap; the device's timing-slot time (the sum of every job's
held_s) against wall time, and that time by part (freezing the others, idle probes, calibration,
warm-up, the clocked loop, comparisons, baselines, thawing; gate.SLOT_PARTS); and the spinner
check (the candidate's median and interval beside the spinners against its serial interval).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kernelagent.harness.server.gate import SLOT_PARTS

HERE = Path(__file__).resolve().parent
SPINNER = HERE.parent / "tests" / "adversarial" / "n1_spinner_neighbour.py"


def candidates(pattern: str | None, samples: int) -> list[tuple[str, Path, str]]:
    """(key, problem, source) for every solution, `samples` distinct copies each."""
    from kernelagent.bench import discover, find_candidates

    out = []
    for ref in discover(HERE, pattern=pattern):
        found = find_candidates(HERE / "solutions", ref)
        if not found:
            continue
        source = found[0].read_text(encoding="utf-8")
        for i in range(samples):
            out.append((f"{ref.level}/{ref.name}#{i}", ref.path, f"# overlap sample {i}\n{source}"))
    return out


def _row(key: str, result: Any) -> dict[str, Any]:
    cand = result.timings.get("candidate")
    return {"key": key, "status": result.status, "median_ms": cand.median_ms if cand else None,
            # the kernel trace's device time per call (issue 58's device clock), None where untraced
            "device_ms": result.per_call.device_ms if result.per_call is not None else None,
            "speedup": result.speedups.get("compile"), "interval": result.speedup_intervals.get("compile"),
            "time_interval": _time_interval(cand.samples_ms if cand else []),
            "held_s": float((result.concurrency or {}).get("held_s", 0.0)),
            "wait_s": float((result.concurrency or {}).get("wait_s", 0.0)),
            "idle_wait_s": float((result.concurrency or {}).get("idle_wait_s", 0.0)),
            # when the job ran and held the slot (epoch seconds, the server's clock): the fill and gaps
            "span": (result.concurrency or {}).get("span"), "held": (result.concurrency or {}).get("held"),
            "slot_parts_s": {k: float((result.concurrency or {}).get(k, 0.0)) for k in SLOT_PARTS},
            # the evidence's profiled part holds the slot too (server/evidence.py), in a record of its own
            "evidence_held_s": sum(float(((result.concurrency or {}).get(part) or {}).get("held_s", 0.0))
                                   for part in ("evidence_slot", "profile_slot")),
            "evidence_phases": dict((result.kernel_evidence or {}).get("phases") or {}),
            "server_cpu_s": float((result.stage_seconds or {}).get("server_cpu", 0.0)),
            "calibration": {k: (result.timed_loop or {}).get(k) for k in ("calibration_reused", "plan_reused",
                                                                          "calibrations_s")},
            "total_s": float(result.stage_seconds.get("total", 0.0))}


def _time_interval(samples: list[float]) -> list[float] | None:
    """A 95% bootstrap interval of the median time (harness/stats.py's method, as a ratio to 1 ms)."""
    from kernelagent.harness import stats

    if len(samples) < 5:
        return None
    interval = stats.speedup_interval([1.0] * len(samples), samples)
    return [1.0 / interval[1], 1.0 / interval[0]] if interval else None


def _overlaps(a: list[float] | None, b: list[float] | None) -> bool | None:
    if not a or not b:
        return None
    return a[0] <= b[1] and b[0] <= a[1]


def serial_copies(rows: list[dict[str, Any]], key: str, clock: str = "median_ms") -> list[float]:
    """The serial medians (ms) of every copy of `key`'s candidate (`level1/1_relu#0`, `#1`, ...):
    the same source evaluated alone in separate jobs; `clock` "device_ms" for the device clock."""
    stem = key.split("#")[0]
    return sorted(float(r[clock]) for r in rows
                  if r["key"].split("#")[0] == stem and isinstance(r.get(clock), (int, float)))


def within_copies(copies: list[float], median: float | None) -> bool | None:
    """Does a median beside the spinners lie within the serial copies' range? A job's own interval
    covers the noise within its loop; two jobs of the same candidate alone differ by more (the
    first H200 runs: relu's serial copies 0.944-0.957x Inductor, 1.4% apart, against intervals of
    about 0.3%), so "the neighbour changes nothing" is judged against the copies' spread as well
    as against the first copy's interval. None with fewer than two copies."""
    if median is None or len(copies) < 2:
        return None
    return copies[0] <= median <= copies[-1]


def run_mode(device: str, cache: Path, jobs: list[tuple[str, Path, str]], config: Any, concurrency: int) -> dict:
    from kernelagent.harness import Evaluator

    from host_cpu import machine_cpu_seconds

    # daemon=False: a server of this measurement's own, whatever KERNELAGENT_DAEMON says: a warm
    # harness would run outside this process's tree (host_cpu.py --tree) and keep its jobs'
    # count from another run (bench_throughput.py measures the same way).
    with Evaluator(device=device, cache_dir=cache, concurrency=concurrency, daemon=False) as ev:
        ev.fingerprint()  # the server's start is not the evaluations' time
        started, cpu0 = time.monotonic(), machine_cpu_seconds()
        results = ev.map([(problem, source, config) for _, problem, source in jobs])
        wall = time.monotonic() - started
        # every process on the host meanwhile: the caller, the server, its jobs, ncu, compilers
        host_cpu = machine_cpu_seconds() - cpu0
        rows = [_row(key, r) for (key, _, _), r in zip(jobs, results)]
        held = sum(r["held_s"] for r in rows)
        parts = {k.removeprefix("slot_").removesuffix("_s"): round(sum(r["slot_parts_s"][k] for r in rows), 2)
                 for k in SLOT_PARTS}
        parts["other"] = round(held - sum(parts.values()), 2)
        evidence_held = sum(r["evidence_held_s"] for r in rows)
        parts["evidence"] = round(evidence_held, 2)
        held += evidence_held
        return {"concurrency": ev.concurrency, "wall_s": round(wall, 2), "evaluations": len(rows),
                "evaluations_per_gpu_minute": round(len(rows) / wall * 60, 2),
                "slot_held_s": round(held, 2), "slot_busy_share": round(held / wall, 3) if wall else None,
                "slot_parts_s": parts, "host_cpu_s": round(host_cpu, 2),
                "host_cpu_s_per_evaluation": round(host_cpu / max(len(rows), 1), 2), "rows": rows}


def compare(pattern: str | None, samples: int, trials: int, jobs_at_once: int, spinners: int,
            work: Path, partial: Path | None = None, kernel_evidence: bool = True) -> dict[str, Any]:
    from kernelagent.harness import EvalConfig, Evaluator
    from kernelagent.harness.caller.pool import visible_gpus

    device = "cuda" if visible_gpus() else "cpu"
    config = EvalConfig(trials=trials, kernel_evidence=kernel_evidence)
    jobs = candidates(pattern, samples)
    if not jobs:
        raise SystemExit(f"no solution matches {pattern!r}")
    cache = work / "cache"
    firsts = {str(problem): (key, problem, source) for key, problem, source in jobs}
    with Evaluator(device=device, cache_dir=cache, daemon=False) as ev:  # primes baselines and compile caches
        primed = ev.map([(problem, source, config) for _, problem, source in firsts.values()])
    print(f"primed {len(primed)} problems: {[r.status for r in primed]}", flush=True)
    serial = run_mode(device, cache, jobs, config, 1)
    print(f"serial: {serial['evaluations']} evaluations in {serial['wall_s']} s = "
          f"{serial['evaluations_per_gpu_minute']} per GPU-minute", flush=True)
    overlapped = run_mode(device, cache, jobs, config, jobs_at_once)
    print(f"overlapped ({overlapped['concurrency']}): {overlapped['evaluations']} evaluations in "
          f"{overlapped['wall_s']} s = {overlapped['evaluations_per_gpu_minute']} per GPU-minute", flush=True)
    table = []
    for a, b in zip(serial["rows"], overlapped["rows"]):
        table.append({"key": a["key"], "status": [a["status"], b["status"]], "same_verdict": a["status"] == b["status"],
                      "speedup": [a["speedup"], b["speedup"]], "interval": [a["interval"], b["interval"]],
                      "intervals_overlap": _overlaps(a["interval"], b["interval"])})
    out: dict[str, Any] = {
        "device": device, "candidates": len(jobs), "trials": trials, "kernel_evidence": kernel_evidence, "serial": serial, "overlapped": overlapped,
        "throughput_ratio": round(overlapped["evaluations_per_gpu_minute"] / serial["evaluations_per_gpu_minute"], 2),
        "verdicts_identical": all(r["same_verdict"] for r in table),
        "intervals_overlap": all(r["intervals_overlap"] is not False for r in table),
        "table": table,
    }
    if partial is not None:  # what is measured so far, in case the spinner phase is cut off
        import json

        partial.write_text(json.dumps(out, indent=2, default=str) + "\n")
    if spinners > 0:
        key, problem, source = jobs[0]
        spin = SPINNER.read_text(encoding="utf-8")
        ev = Evaluator(device=device, cache_dir=cache, concurrency=spinners + 1, daemon=False)  # as run_mode's
        try:
            ev.fingerprint()
            from concurrent.futures import ThreadPoolExecutor

            pool = ThreadPoolExecutor(spinners + 1)
            noisy = [pool.submit(ev.evaluate, problem, f"# spinner {i}\n{spin}", config) for i in range(spinners)]
            time.sleep(3.0)  # the spinners are importing (and spinning) before the candidate starts
            honest = pool.submit(ev.evaluate, problem, source, config).result()
            # Only the candidate beside them matters; the spinners are stopped with the server.
            neighbours = [f.result() for f in noisy if f.done()]
        finally:
            ev.abort()
            ev.close()
            pool.shutdown(wait=False, cancel_futures=True)
        base = next(r for r in serial["rows"] if r["key"] == key)
        row = _row(key, honest)
        copies = serial_copies(serial["rows"], key)
        device_copies = serial_copies(serial["rows"], key, "device_ms")
        out["spinner"] = {"candidate": key, "spinners": spinners, "serial_median_ms": base["median_ms"],
                          "serial_time_interval": base["time_interval"], "beside_spinners_median_ms": row["median_ms"],
                          "beside_spinners_time_interval": row["time_interval"],
                          "status": honest.status, "idle_wait_s": row["idle_wait_s"],
                          "within_serial_interval": _overlaps(base["time_interval"], row["time_interval"]),
                          "serial_copies_ms": copies, "within_serial_copies": within_copies(copies, row["median_ms"]),
                          # the same judged on the device clock, beside the wall clock's, never in its place
                          "serial_device_ms": base.get("device_ms"), "beside_spinners_device_ms": row["device_ms"],
                          "serial_copies_device_ms": device_copies,
                          "within_serial_copies_device": within_copies(device_copies, row["device_ms"]),
                          "spinner_statuses": [r.status for r in neighbours],
                          "concurrency": honest.concurrency}
    return out


def print_table(out: dict[str, Any]) -> None:
    print(f"\n{'candidate':34} {'serial':>10} {'overlapped':>10} {'speedup s':>10} {'speedup o':>10}  overlap")
    for r in out["table"]:
        s, o = r["speedup"]
        print(f"{r['key'][:34]:34} {r['status'][0]:>10} {r['status'][1]:>10} "
              f"{(s or 0):10.3f} {(o or 0):10.3f}  {r['intervals_overlap']}")
    print(f"\nthroughput: overlapped / serial = {out['throughput_ratio']}x; verdicts identical: "
          f"{out['verdicts_identical']}; speedup intervals overlap: {out['intervals_overlap']}")
    for mode in ("serial", "overlapped"):
        m = out[mode]
        print(f"{mode}: wall {m['wall_s']} s, timing slot held {m['slot_held_s']} s ({m['slot_busy_share']} of wall), "
              f"host CPU {m.get('host_cpu_s')} s ({m.get('host_cpu_s_per_evaluation')} per evaluation)")
        if m.get("slot_parts_s"):
            print("  the slot's time by part (s): " + ", ".join(f"{k} {v}" for k, v in m["slot_parts_s"].items()))
    if "spinner" in out:
        sp = out["spinner"]
        print(f"spinner: {sp['candidate']} median {sp['serial_median_ms']} ms serially, "
              f"{sp['beside_spinners_median_ms']} ms beside {sp['spinners']} spinners (interval "
              f"{sp['beside_spinners_time_interval']} vs serial {sp['serial_time_interval']}: overlap "
              f"{sp['within_serial_interval']}; within the {len(sp.get('serial_copies_ms') or [])} serial copies' "
              f"range {sp.get('serial_copies_ms')}: {sp.get('within_serial_copies')}); idle wait {sp['idle_wait_s']} s; "
              f"status {sp['status']}")
        print(f"  on the device clock: {sp.get('serial_device_ms')} ms serially, "
              f"{sp.get('beside_spinners_device_ms')} ms beside the spinners; within the serial copies' range "
              f"{sp.get('serial_copies_device_ms')}: "
              f"{sp.get('within_serial_copies_device')}")
