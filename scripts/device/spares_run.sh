#!/usr/bin/env bash
# Issue 39 on the device: one evaluation's wait with and without spare evidence sessions
# and the Triton warm-up (KERNELAGENT_EVIDENCE_SPARES, KERNELAGENT_TRITON_WARM), the evidence's GPU tests, then serial against overlapped throughput.
#   bash scripts/device/spares_run.sh [overlap-samples]
set -u
. "$(dirname "$0")/env.sh"
SAMPLES=${1:-2}
log device; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
summ() { python3 -c "
import json,sys; d=json.load(open(sys.argv[1]))
for r in d['rows']:
    e=r.get('evidence',{}); p=e.get('phases',{})
    print(r['label'], r['status'], 'wall', r['wall_s'], 'cpu', r['host_cpu_s'], 'evidence', e.get('seconds'), 'ready_wait', p.get('ready_wait_s'), 'spare', p.get('spare'), 'first', p.get('target_first_s'), 'profiled', p.get('profiled_s'), {k: v for k, v in r['stage_seconds'].items() if k in ('start','compile','correctness','timing','evidence')})
" "$1"; }
log "latency without spares or the Triton warm-up (before)"
KERNELAGENT_EVIDENCE_SPARES=0 KERNELAGENT_TRITON_WARM=0 timeout 150 python3 benchmarks/eval_latency.py --repeats 3 --out "$OUT/latency_nospare.json" > "$OUT/latency_nospare.txt" 2>&1; summ "$OUT/latency_nospare.json"
log "latency with spares"
timeout 150 python3 benchmarks/eval_latency.py --repeats 3 --out "$OUT/latency.json" > "$OUT/latency.txt" 2>&1; summ "$OUT/latency.json"
log "gpu tests"
timeout 150 python3 -m pytest -m gpu -q -x -p no:cacheprovider -o addopts= --durations=5 tests/test_kernel_evidence_gpu.py 2>&1 | tail -8
log "overlap ($SAMPLES samples)"
timeout 280 python3 benchmarks/host_cpu.py --tree --out "$OUT/overlap_cpu.json" -- \
  python3 benchmarks/bench_throughput.py --overlap --filter 'level1/[1-6]_*' --samples "$SAMPLES" --spinners 0 \
  --out "$OUT/overlap.json" 2>&1 | tail -30
log end
