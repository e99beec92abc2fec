#!/usr/bin/env bash
# Issue 59 on nvidia-h200-x2: the two servers of a row run one loop plan per problem and measure
# each problem's calibration once between them (calibration_store.py: the shared plan, the claim,
# the deferred read). One row on GPUs 0,1 against kept baselines (carry [".baselines-kept"]); its
# line "calibrations N measured in the slot ... read from another server" is the reading.
#   bash scripts/device/calibration_share_run.sh [samples] [filter]
set -u
. "$(dirname "$0")/env.sh"
SAMPLES=${1:-8}; FILTER=${2:-'level1/[1-6]_*'}
timeout ${BENCH_TIMEOUT:-170} python3 benchmarks/bench_throughput.py --samples "$SAMPLES" --filter "$FILTER" \
  --gpu-sets 0,1 --baselines shared --baselines-dir "${BASELINES_DIR:-.baselines-kept}" \
  --out "$OUT/calibration_share.json" 2>&1 | cut -c1-1500 | tail -20
