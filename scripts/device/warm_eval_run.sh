#!/usr/bin/env bash
# Issue 59 on the device: the wait of `kernelagent eval` from the command line, the warm harness
# being the CLI's default. Empty caches and no harness running, then the same command in a new
# process (the harness warm), then a third; then `--no-daemon` for today's private server.
#   bash scripts/device/warm_eval_run.sh [problem] [solution]
set -u
. "$(dirname "$0")/env.sh"
P=${1:-benchmarks/level1/5_softmax.py}; S=${2:-benchmarks/solutions/level1/5_softmax.py}
export KERNELAGENT_CACHE_DIR=$(mktemp -d /tmp/ka-cache.XXXX) KERNELAGENT_RUNTIME_DIR=$(mktemp -d /tmp/ka-run.XXXX)
unset KERNELAGENT_DAEMON
chmod 700 "$KERNELAGENT_RUNTIME_DIR"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for run in cold second third nodaemon; do
  flag=; [ "$run" = nodaemon ] && flag=--no-daemon
  s=$(date +%s.%N)
  timeout 150 kernelagent eval "$P" "$S" --json $flag > "$OUT/eval_$run.json" 2> "$OUT/eval_$run.err"; rc=$?
  e=$(date +%s.%N)
  python3 - "$OUT/eval_$run.json" "$run" "$rc" "$s" "$e" <<'PY'
import json, sys
path, run, rc, s, e = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
try:
    r = json.loads(open(path).read().splitlines()[0])
except Exception as exc:  # noqa: BLE001
    print(f"{run}: rc {rc}, {e - s:.1f} s, no result ({exc})"); sys.exit()
st = r.get("stage_seconds", {})
print(f"{run}: rc {rc}, {e - s:.1f} s wall; {r['status']} speedups {r.get('speedups')} device {r.get('speedups_device')}; "
      f"per_call {r.get('per_call')}; daemon {(r.get('isolation') or {}).get('daemon')}; "
      f"stages { {k: round(v, 2) for k, v in st.items() if isinstance(v, (int, float)) and v >= 0.05} }")
PY
done
ls "$KERNELAGENT_RUNTIME_DIR"
