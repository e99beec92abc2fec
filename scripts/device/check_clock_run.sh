#!/usr/bin/env bash
# Issue 59: where a correctness stage's 4-7 s go, on one GPU. One warm-up evaluation, then one
# evaluation of each of our level-1 problems the filter takes, alone (no neighbour), each check's
# server clock printed (candidate / relay / reference seconds, TrialResult.seconds) beside the stages.
#   bash scripts/device/check_clock_run.sh [filter]
set -u
. "$(dirname "$0")/env.sh"
FILTER=${1:-'[1-6]_*'}
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null
timeout ${CLOCK_TIMEOUT:-240} python3 - "$FILTER" <<'PY' 2>&1 | tail -60
import glob, json, os, sys, time
from pathlib import Path
from kernelagent.harness.caller.evaluator import Evaluator
files = sorted(glob.glob(f"benchmarks/level1/{sys.argv[1]}.py"))
with Evaluator(device=os.environ.get("DEVICE", "cuda:0")) as ev:
    for i, f in enumerate([files[0]] + files):
        sol = Path(f.replace("level1/", "solutions/level1/"))
        t = time.perf_counter()
        r = ev.evaluate(Path(f), sol.read_text())
        d = r.to_dict()
        print(("warm-up " if i == 0 else "") + f"{Path(f).stem}: {d['status']} {time.perf_counter() - t:.2f} s, "
              f"stages {json.dumps({k: round(v, 2) for k, v in d.get('stage_seconds', {}).items()})}")
        for trial in d.get("trials", []):
            print(f"   {trial['name'][:28]:28s} {json.dumps(trial.get('seconds'))}")
PY
