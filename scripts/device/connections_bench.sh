#!/usr/bin/env bash
# Issue 59 on one GPU: does the candidate's process on one CUDA connection
# (KERNELAGENT_CANDIDATE_CONNECTIONS=1) change a loaded server's throughput? The CUDA driver makes
# and frees contexts under one host-wide lock, and a context with more connections takes longer
# to make and free (driver_contention.py, run J): the jobs of one GPU queue there too. A warm-up
# batch (Inductor's and Triton's caches), then the same candidates with the default, with one
# connection and with the default again (A B A: an order effect shows as the two A rows apart).
# Each row's JSON lands in $OUT; its audits are printed (compare rows with the same work).
#   bash scripts/device/connections_bench.sh [samples] [filter]
set -u
. "$(dirname "$0")/env.sh"
SAMPLES=${1:-8}; FILTER=${2:-'level1/[1-6]_*'}; LIMIT=${ROW_TIMEOUT:-170}
log device; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
bench() {  # bench SAMPLES OUTFILE [setting]
  env ${3:-} timeout "$LIMIT" python3 benchmarks/bench_throughput.py --samples "$1" --filter "$FILTER" --gpu-sets 0 \
    --out "$OUT/$2" 2>&1 | grep -E "^GPUs|fill:|re-run|audits" | cut -c1-400
}
log "warm-up"; bench 1 warmup.json
log "A: default"; bench "$SAMPLES" default_1.json
log "B: KERNELAGENT_CANDIDATE_CONNECTIONS=1"; bench "$SAMPLES" one_connection.json KERNELAGENT_CANDIDATE_CONNECTIONS=1
log "A: default again"; bench "$SAMPLES" default_2.json
log end
