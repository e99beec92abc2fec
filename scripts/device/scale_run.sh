#!/usr/bin/env bash
# Issue 44 on a two-GPU machine (nvidia-h100-x2 or nvidia-h200-x2), one call of about 7 minutes:
# bench_throughput.py on GPU 0 alone, then on GPUs 0 and 1 (each server pinned to half the CPUs),
# then on both again with every server on every CPU (--unpinned), over the same candidates
# (SAMPLES copies of each of our level-1 solutions the filter takes: 5 x 6 = 30 by default), with
# the host's CPU by process kind and per evaluation, the timeline (fill and drain) and ncu's
# kernel time per problem in each row. The JSON lands in $OUT.
#   bash scripts/device/scale_run.sh [samples] [filter] [extra bench_throughput flags]
# Issue 59 on four GPUs (nvidia-h200-x4), the three rows in one call, every row against the same
# baselines (timed once in an uncounted warm-up):
#   GPU_SETS="0 0,1 0,1,2,3" bash scripts/device/scale_run.sh 8 'level1/[1-6]_*' '--baselines shared'
# Rows that do not fit one call: the next call reads the first's baselines (copied from its $OUT
# to .baselines-kept here, and carried):
#   BASELINES_DIR=.baselines-kept GPU_SETS="0,1,2,3" bash scripts/device/scale_run.sh 22 ... '--baselines shared'
set -u
. "$(dirname "$0")/env.sh"
SAMPLES=${1:-5}; FILTER=${2:-'level1/[1-6]_*'}; EXTRA=${3---unpinned}  # '' for none
GPU_SETS=${GPU_SETS:-0 0,1}
# With --baselines shared, the entries come back in $OUT/baselines; a later call of the same
# measurement reads them where they are carried (BASELINES_DIR=.baselines-kept, carry it).
case " $EXTRA " in *" --baselines shared "*) EXTRA="$EXTRA --baselines-dir ${BASELINES_DIR:-$OUT/baselines}";; esac
log device; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
log "cores $(nproc), bench_throughput --samples $SAMPLES --filter '$FILTER' --gpu-sets $GPU_SETS $EXTRA"
# shellcheck disable=SC2086  # GPU_SETS and EXTRA are lists
timeout ${BENCH_TIMEOUT:-540} python3 benchmarks/bench_throughput.py --samples "$SAMPLES" --filter "$FILTER" \
  --gpu-sets $GPU_SETS $EXTRA \
  --out "$OUT/scale.json" 2>&1 | cut -c1-1500 | tail -60
log end
