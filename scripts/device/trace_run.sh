#!/usr/bin/env bash
# Issue 55 on the device: the trace as the default evidence. One evaluation's wait (cold, warm),
# the trace's and the evidence's GPU tests, then serial against overlapped throughput with the
# host's CPU by process kind (evidence on: the trace, ncu audits on the seeded share).
#   bash scripts/device/trace_run.sh [overlap-samples] [spinners] [pytest files...]
set -u
. "$(dirname "$0")/env.sh"
SAMPLES=${1:-2}; SPINNERS=${2:-2}; shift 2 || true
TESTS=${*:-tests/test_trace_gpu.py tests/test_kernel_evidence_gpu.py}
log device; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
log "latency: one server, cold then warm"
timeout 100 python3 benchmarks/eval_latency.py --repeats 3 --out "$OUT/latency.json" 2>&1 | cut -c1-1500 | tail -8
log "gpu tests: $TESTS"
set -o pipefail
timeout 180 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider -o addopts= --durations=5 -s $TESTS 2>&1 \
  | tee "$OUT/tests.txt" | grep -E "^(honest|h3_|PASS|FAIL|ERROR|E  )|passed|failed|error" | cut -c1-400 | tail -40
log "overlap ($SAMPLES samples, $SPINNERS spinners)"
timeout 240 python3 benchmarks/host_cpu.py --tree --out "$OUT/overlap_cpu.json" -- \
  python3 benchmarks/bench_throughput.py --overlap --filter 'level1/[1-6]_*' --samples "$SAMPLES" --spinners "$SPINNERS" \
  --out "$OUT/overlap.json" 2>&1 | tail -34
log end
