#!/usr/bin/env bash
# Issue 59 on the device: a cold `kernelagent eval` (empty caches, no harness running) and the
# next one in a new process, in variants interleaved, each cold run with its own empty cache and
# runtime directories (so its own new warm harness). A variant is an environment assignment:
#   bash scripts/device/cold_eval_ab.sh [rounds] [variant ...]
#   e.g. bash scripts/device/cold_eval_ab.sh 2 "" TORCHINDUCTOR_COMPILE_THREADS=2
set -u
. "$(dirname "$0")/env.sh"
ROUNDS=${1:-2}; shift
[ $# -eq 0 ] && set -- ""
P=benchmarks/level1/5_softmax.py; S=benchmarks/solutions/level1/5_softmax.py
unset KERNELAGENT_DAEMON
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
summary() {
python3 - "$@" <<'PY'
import json, sys
path, label, rc, s, e = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
try:
    r = json.loads(open(path).read().splitlines()[0])
except Exception as exc:  # noqa: BLE001
    print(f"{label}: rc {rc}, {e - s:.1f} s, no result ({exc})"); sys.exit()
st = r.get("stage_seconds", {})
job = ((r.get("concurrency") or {}).get("baselines_job") or {}).get("stage_seconds") or {}
keep = ("server_start", "baseline_wait", "total_server", "baselines", "baselines_compile", "evidence")
print(f"{label}: rc {rc}, {e - s:.1f} s wall; {r['status']} x{(r.get('speedups') or {}).get('compile')}; "
      f"audited {bool((r.get('kernel_evidence') or {}).get('ncu') or st.get('evidence', 0) > 1.0)}; "
      f"stages { {k: round(st[k], 2) for k in keep if isinstance(st.get(k), (int, float))} }; "
      f"baselines job { {k: round(v, 2) for k, v in job.items() if isinstance(v, (int, float)) and v >= 0.05} }; "
      f"workers {((r.get('fingerprint') or {}).get('concurrency') or {}).get('compile_workers')}; "
      f"server start {(r.get('fingerprint') or {}).get('start_s')}")
PY
}
for round in $(seq 1 "$ROUNDS"); do
  for variant in "$@"; do
    name=${variant:-default}
    export KERNELAGENT_CACHE_DIR=$(mktemp -d /tmp/ka-cache.XXXX) KERNELAGENT_RUNTIME_DIR=$(mktemp -d /tmp/ka-run.XXXX)
    chmod 700 "$KERNELAGENT_RUNTIME_DIR"
    for run in cold second; do
      tag="r${round}_${name//[^A-Za-z0-9_]/_}_$run"
      s=$(date +%s.%N)
      env $variant timeout 150 kernelagent eval "$P" "$S" --json > "$OUT/$tag.json" 2> "$OUT/$tag.err"; rc=$?
      e=$(date +%s.%N)
      summary "$OUT/$tag.json" "$tag" "$rc" "$s" "$e"
    done
    pkill -f "$KERNELAGENT_RUNTIME_DIR" 2>/dev/null; sleep 1
  done
done
