#!/usr/bin/env bash
# Issue 39 on the device, after the cuts: one evaluation's wait (cold, warm), the evidence's GPU
# tests, then serial against overlapped throughput with the host's CPU by process kind.
#   bash scripts/device/cost_run.sh [overlap-samples] [spinners] [pytest files...]
set -u
. "$(dirname "$0")/env.sh"
SAMPLES=${1:-2}; SPINNERS=${2:-2}; shift 2 || true
TESTS=${*:-tests/test_kernel_evidence_gpu.py}
log device; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
log "latency: one server, cold then warm"
timeout 150 python3 benchmarks/eval_latency.py --repeats 3 --out "$OUT/latency.json" 2>&1 | cut -c1-1500 | tail -8
log "gpu tests: $TESTS"
timeout 200 python3 -m pytest -m gpu -q -x -p no:cacheprovider -o addopts= --durations=5 $TESTS 2>&1 | tail -15
log "overlap ($SAMPLES samples, $SPINNERS spinners)"
timeout 330 python3 benchmarks/host_cpu.py --tree --out "$OUT/overlap_cpu.json" -- \
  python3 benchmarks/bench_throughput.py --overlap --filter 'level1/[1-6]_*' --samples "$SAMPLES" --spinners "$SPINNERS" \
  --out "$OUT/overlap.json" 2>&1 | tail -34
log end
