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
  python3 scripts/device/eval_line.py "$OUT/eval_$run.json" "$run" "$rc" "$s" "$e"
done
ls "$KERNELAGENT_RUNTIME_DIR"
