#!/usr/bin/env bash
# Issue 59 on a two-GPU machine: is a job slower only because a second server runs beside it?
# The same candidates on GPU 0 alone, then on GPU 0 while GPU 1 runs the same batch in another
# process (each its own server, store and baseline cache), then the steady state of each
# (scripts/device/steady_latency.py). Each process pins its server as a one-GPU set does (every
# CPU), where a two-GPU bench gives each server half: compare with scale_run.sh's 0,1 row for that.
# The JSON lands in $OUT (three files).
#   bash scripts/device/beside_run.sh [samples] [filter]
set -u
. "$(dirname "$0")/env.sh"
SAMPLES=${1:-8}; FILTER=${2:-'level1/[1-6]_*'}; LIMIT=${BESIDE_TIMEOUT:-200}
log device; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
bench() {  # bench GPUS OUTFILE
  timeout "$LIMIT" python3 benchmarks/bench_throughput.py --samples "$SAMPLES" --filter "$FILTER" --gpu-sets "$1" \
    --out "$OUT/$2" 2>&1 | grep -E "^GPUs|fill:|re-run" | cut -c1-400
}
log "alone on GPU 0"; bench 0 alone.json
log "GPU 0 beside GPU 1"; bench 0 beside0.json & bench 1 beside1.json; wait
python3 scripts/device/steady_latency.py "$OUT/alone.json" "$OUT/beside0.json" "$OUT/beside1.json"
log end
