#!/usr/bin/env bash
# Issue 59 on nvidia-h200-x2: is the two-GPU row's longer job latency the host's CPU share? One
# call, every row against the kept baselines of an earlier scale_run.sh call (carry
# [".baselines-kept"]): GPU 0 alone on the CPUs the two-GPU row gives GPU 0's server (taskset on
# the first half), then GPUs 0,1 pinned (each server its half) and unpinned (both on every CPU).
#   bash scripts/device/scale_share_run.sh [samples] [filter]
set -u
. "$(dirname "$0")/env.sh"
SAMPLES=${1:-16}; FILTER=${2:-'level1/[1-6]_*'}
KEPT=${BASELINES_DIR:-.baselines-kept}
N=$(nproc); HALF=$((N / 2 - 1))
log device; nvidia-smi --query-gpu=index,name --format=csv,noheader; nvidia-smi topo -m | head -6
lscpu | grep -i 'numa node' | head -4
log "GPU 0 alone on CPUs 0-$HALF"
timeout 250 taskset -c 0-$HALF python3 benchmarks/bench_throughput.py --samples "$SAMPLES" --filter "$FILTER" \
  --gpu-sets 0 --baselines shared --baselines-dir "$KEPT" --out "$OUT/half.json" 2>&1 | cut -c1-1500 | tail -14
log "GPUs 0,1 pinned and unpinned"
timeout 280 python3 benchmarks/bench_throughput.py --samples "$SAMPLES" --filter "$FILTER" \
  --gpu-sets 0,1 --unpinned --baselines shared --baselines-dir "$KEPT" --out "$OUT/two.json" 2>&1 | cut -c1-1500 | tail -30
log end
