#!/usr/bin/env bash
# Issue 44 on a two-GPU machine (nvidia-h100-x2 or nvidia-h200-x2), one call of about 7 minutes:
# bench_throughput.py on GPU 0 alone, then on GPUs 0 and 1, over the same candidates (SAMPLES
# copies of each of our level-1 solutions the filter takes: 4 x 6 = 24 by default), with the
# host's CPU by process kind and per evaluation in each row. The JSON lands in $OUT.
#   bash scripts/device/scale_run.sh [samples] [filter]
set -u
. "$(dirname "$0")/env.sh"
SAMPLES=${1:-4}; FILTER=${2:-'level1/[1-6]_*'}
log device; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
log "cores $(nproc), bench_throughput --samples $SAMPLES --filter '$FILTER' --gpu-sets 0 0,1"
timeout 450 python3 benchmarks/bench_throughput.py --samples "$SAMPLES" --filter "$FILTER" --gpu-sets 0 0,1 \
  --out "$OUT/scale.json" 2>&1 | cut -c1-2500 | tail -24
log end
