#!/usr/bin/env bash
# Issue 59 on the device: a cold `kernelagent eval` (empty caches, no harness running) and the
# next one in a new process, in variants interleaved, each cold run with its own empty cache and
# runtime directories (so its own new warm harness). A variant is an environment assignment:
#   bash scripts/device/cold_eval_ab.sh [rounds] [variant ...]
#   e.g. bash scripts/device/cold_eval_ab.sh 2 "" TORCHINDUCTOR_COMPILE_THREADS=2
# USER_ENV=1 runs each command without the machine's PYTHONDONTWRITEBYTECODE=1 (which a user's
# shell rarely sets): the command then reads its own modules' bytecode instead of compiling them.
# EVAL_FLAGS is added to every `kernelagent eval` (e.g. EVAL_FLAGS="--audit always": every result
# audited by Nsight Compute, to read where an audit's seconds go in a cold and a second eval).
set -u
. "$(dirname "$0")/env.sh"
ROUNDS=${1:-2}; shift
[ $# -eq 0 ] && set -- ""
P=benchmarks/level1/5_softmax.py; S=benchmarks/solutions/level1/5_softmax.py
unset KERNELAGENT_DAEMON
RUNS=$(mktemp -d /tmp/cold-eval.XXXX)  # each run's result and stderr; $OUT/cold_eval.jsonl has them all
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for round in $(seq 1 "$ROUNDS"); do
  for variant in "$@"; do
    name=${variant:-default}
    export KERNELAGENT_CACHE_DIR=$(mktemp -d /tmp/ka-cache.XXXX) KERNELAGENT_RUNTIME_DIR=$(mktemp -d /tmp/ka-run.XXXX)
    chmod 700 "$KERNELAGENT_RUNTIME_DIR"
    for run in cold second; do
      tag="r${round}_${name//[^A-Za-z0-9_]/_}_$run"
      s=$(date +%s.%N)
      env ${USER_ENV:+-u PYTHONDONTWRITEBYTECODE} $variant timeout 150 kernelagent eval "$P" "$S" --json ${EVAL_FLAGS:-} > "$RUNS/$tag.json" 2> "$RUNS/$tag.err"; rc=$?
      e=$(date +%s.%N)
      # One file in $OUT for every run (the device tool brings back a few files a call): a line each.
      python3 scripts/device/eval_line.py "$RUNS/$tag.json" "$tag" "$rc" "$s" "$e" \
        --keep "$OUT/cold_eval.jsonl" --stderr "$RUNS/$tag.err"
    done
    grep -h "bytecode" "$KERNELAGENT_RUNTIME_DIR"/*.log 2>/dev/null | tail -2
    pkill -f "$KERNELAGENT_RUNTIME_DIR" 2>/dev/null; sleep 1
  done
done
