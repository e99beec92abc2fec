"""One line for one `kernelagent eval --json` run of a device script (warm_eval_run.sh,
cold_eval_ab.sh): its wall, verdict, speedups on both clocks, per-call figures, whether it was
drawn for an audit, its stages, its problem's baselines' job, the server's start by phase and
the warm harness it used. With --keep, the run is also appended to a JSON-lines file (its label,
rc, wall, result and the tail of --stderr): one file for every run of a call.
    python3 scripts/device/eval_line.py RESULT.json LABEL RC START_EPOCH END_EPOCH [--keep F --stderr E]
"""
from __future__ import annotations

import argparse
import json


def keep(keep_path: str, label: str, rc: str, wall: float, result: dict | None, stderr_path: str | None) -> None:
    try:
        tail = open(stderr_path).read()[-2000:] if stderr_path else ""
    except OSError:
        tail = ""
    with open(keep_path, "a") as out:
        out.write(json.dumps({"tag": label, "rc": int(rc), "wall_s": wall, "result": result,
                              "stderr_tail": tail}) + "\n")


def main(path: str, label: str, rc: str, start: str, end: str, keep_path: str | None = None,
         stderr_path: str | None = None) -> None:
    wall = float(end) - float(start)
    try:
        r = json.loads(open(path).read().splitlines()[0])
    except Exception as exc:  # noqa: BLE001
        if keep_path:
            keep(keep_path, label, rc, wall, None, stderr_path)
        print(f"{label}: rc {rc}, {wall:.1f} s, no result ({exc})")
        return
    if keep_path:
        keep(keep_path, label, rc, wall, r, stderr_path)
    st = r.get("stage_seconds") or {}
    job = ((r.get("concurrency") or {}).get("baselines_job") or {}).get("stage_seconds") or {}
    fingerprint = r.get("fingerprint") or {}
    daemon = (r.get("isolation") or {}).get("daemon")
    brief = lambda d: {k: round(v, 2) for k, v in d.items() if isinstance(v, (int, float)) and v >= 0.05}  # noqa: E731
    print(f"{label}: rc {rc}, {wall:.1f} s wall; {r['status']} speedups {r.get('speedups')} "
          f"device {r.get('speedups_device')}; per_call {r.get('per_call')}; "
          f"audited {bool((r.get('kernel_evidence') or {}).get('ncu') or st.get('evidence', 0) > 1.0)}; "
          f"stages {brief(st)}; baselines job {brief(job)}; "
          f"workers {(fingerprint.get('concurrency') or {}).get('compile_workers')}; "
          f"server start {fingerprint.get('start_s')}; bytecode {fingerprint.get('bytecode')!r}; "
          f"daemon {None if daemon is None else {k: daemon.get(k) for k in ('pid', 'started_now')}}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one line for one `kernelagent eval --json` run")
    for name in ("path", "label", "rc", "start", "end"):
        parser.add_argument(name)
    parser.add_argument("--keep", help="a JSON-lines file to append this run to")
    parser.add_argument("--stderr", help="the run's stderr, whose tail --keep records")
    args = parser.parse_args()
    main(args.path, args.label, args.rc, args.start, args.end, args.keep, args.stderr)
