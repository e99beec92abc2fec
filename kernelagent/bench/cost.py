"""What a bench run's evaluations cost (issue 39): evaluations per device-minute, the share of
the wall time each device's timing slot was held (the timed loops, their calibration and
comparisons, the baselines' timing, the kernel evidence's profiled part), host CPU-seconds per
evaluation (each job's own processes, its evidence session and its thread in the server:
server/job.py `cpu_*`), and the stage and slot parts summed. In `summary.json` as `cost`; from
the results in the store, so a resumed run counts every session's evaluations."""

from __future__ import annotations

import json
from typing import Any

SLOT_PARTS = ("slot_freeze_s", "idle_wait_s", "slot_calibration_s", "slot_warmup_s", "slot_loop_s",
              "slot_compare_s", "slot_baselines_s", "slot_thaw_s")


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


SLOT_RECORDS = ("evidence_slot", "profile_slot")  # holds of the slot outside the timed phase, each with held_s


def held_s(result: dict) -> float:
    """How long one evaluation held its device's timing slot: its timed phase and each record's."""
    conc = result.get("concurrency") or {}
    return _num(conc.get("held_s")) + sum(_num((conc.get(k) if isinstance(conc.get(k), dict) else {}).get("held_s"))
                                          for k in SLOT_RECORDS)


def cost(results: list[dict], wall_s: float) -> dict[str, Any]:
    """The cost block of `results` (EvalResult dicts) over a run of `wall_s` seconds."""
    devices = {json.dumps([(r.get("fingerprint") or {}).get(k) for k in ("uuid", "pci_bus_id", "device")])
               for r in results} or {"-"}
    n_devices = max(1, len(devices))
    stages: dict[str, float] = {}
    slot: dict[str, float] = {}
    held = 0.0
    for r in results:
        for name, seconds in (r.get("stage_seconds") or {}).items():
            stages[name] = stages.get(name, 0.0) + _num(seconds)
        conc = r.get("concurrency") or {}
        held += held_s(r)
        for part in SLOT_PARTS:
            slot[part] = slot.get(part, 0.0) + _num(conc.get(part))
        for record in SLOT_RECORDS:
            sub = conc.get(record) if isinstance(conc.get(record), dict) else {}
            slot[record.replace("_slot", "_s")] = slot.get(record.replace("_slot", "_s"), 0.0) + _num(sub.get("held_s"))
    n = len(results)
    cpu = stages.get("cpu_job", 0.0)
    return {
        "evaluations": n, "devices": n_devices, "wall_s": round(wall_s, 2),
        "evaluations_per_device_minute": round(n / (wall_s / 60) / n_devices, 3) if wall_s > 0 else None,
        "slot_held_s": round(held, 2),
        "slot_busy_share": round(held / (wall_s * n_devices), 3) if wall_s > 0 else None,
        "host_cpu_s_per_evaluation": round(cpu / n, 2) if n else None,
        "host_cpu_s_by_part": {k.removeprefix("cpu_"): round(v, 2) for k, v in sorted(stages.items())
                               if k.startswith("cpu_") and k != "cpu_job"},
        "slot_parts_s": {k: round(v, 2) for k, v in slot.items()},
        "stage_seconds_sum": {k: round(v, 2) for k, v in sorted(stages.items()) if not k.startswith("cpu_")},
    }


def run_cost(store: Any, run_id: str, wall_s: float) -> dict[str, Any]:
    rows = store._query("SELECT e.result FROM evaluation_log l JOIN evaluations e ON e.key = l.key "
                        "WHERE l.run_id = ?", (run_id,))
    results = []
    for row in rows:
        try:
            results.append(json.loads(row["result"]))
        except (TypeError, ValueError):
            continue
    return cost(results, wall_s)
