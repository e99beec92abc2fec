#!/usr/bin/env bash
# Issue 55 on the device: what the tracer costs the timings (traced and untraced copies of the
# same candidates alternating in one server: benchmarks/trace_cost.py), then serial against
# overlapped throughput with the evidence on (the trace, ncu audits on wins and the seeded share)
# and the host's CPU by process kind.
#   bash scripts/device/trace_cost_run.sh [rounds] [overlap-samples] [spinners] [trace|overlap: that part only] [overlap seconds]
set -u
. "$(dirname "$0")/env.sh"
ROUNDS=${1:-3}; SAMPLES=${2:-4}; SPINNERS=${3:-2}; ONLY=${4:-}; OVERLAP_S=${5:-280}
log device; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "$ONLY" != overlap ]; then
  log "tracer's cost: $ROUNDS rounds"
  timeout 330 python3 benchmarks/trace_cost.py --rounds "$ROUNDS" --out "$OUT/trace_cost.json" 2>&1 \
    | grep -v Warning | tail -14
fi
[ "$ONLY" = trace ] && { log end; exit 0; }
log "overlap ($SAMPLES samples, $SPINNERS spinners)"
timeout "$OVERLAP_S" python3 benchmarks/host_cpu.py --tree --out "$OUT/overlap_cpu.json" -- \
  python3 benchmarks/bench_throughput.py --overlap --filter 'level1/[1-6]_*' --samples "$SAMPLES" --spinners "$SPINNERS" \
  --out "$OUT/overlap.json" 2>&1 | grep -v Warning | tail -34
log end
