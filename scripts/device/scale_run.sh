#!/usr/bin/env bash
# Issue 44 on a two-GPU machine (nvidia-h100-x2 or nvidia-h200-x2), one call of about 7 minutes:
# bench_throughput.py on GPU 0 alone, then on GPUs 0 and 1 (each server pinned to half the CPUs),
# then on both again with every server on every CPU (--unpinned), over the same candidates
# (SAMPLES copies of each of our level-1 solutions the filter takes: 5 x 6 = 30 by default), with
# the host's CPU by process kind and per evaluation, the timeline (fill and drain) and ncu's
# kernel time per problem in each row. The JSON lands in $OUT.
#   bash scripts/device/scale_run.sh [samples] [filter] [extra bench_throughput flags]
set -u
. "$(dirname "$0")/env.sh"
SAMPLES=${1:-5}; FILTER=${2:-'level1/[1-6]_*'}; EXTRA=${3---unpinned}  # '' for none
log device; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
log "cores $(nproc), bench_throughput --samples $SAMPLES --filter '$FILTER' --gpu-sets 0 0,1 $EXTRA"
# shellcheck disable=SC2086  # EXTRA is a list of flags
timeout ${BENCH_TIMEOUT:-540} python3 benchmarks/bench_throughput.py --samples "$SAMPLES" --filter "$FILTER" --gpu-sets 0 0,1 $EXTRA \
  --out "$OUT/scale.json" 2>&1 | cut -c1-1500 | tail -40
log end
