#!/usr/bin/env bash
# Issue 39 on the device: where an evaluation's time and the host's CPU go (run from the repo root
# by the device tool; writes under $OUT). Every step has its own timeout.
#   bash scripts/device/cost_measure.sh [overlap-samples]
set -u
. "$(dirname "$0")/env.sh"
SAMPLES=${1:-2}
{
log device; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
NCU=$(python3 -c "from kernelagent.harness.server.ncu import find_ncu; print(find_ncu())")
log "micro (ncu: $NCU)"
for c in "import torch" "import torch, triton, torch._dynamo" "import torch; torch.zeros(1,device='cuda'); torch.cuda.synchronize()"; do
  timeout 60 /usr/bin/time -f "%e s wall %U user %S sys: $c" python3 -c "$c"
done
timeout 60 /usr/bin/time -f "%e s wall %U user %S sys: ncu --version" "$NCU" --version >/dev/null
timeout 90 /usr/bin/time -f "%e s wall %U user %S sys: ncu session, torch + one tiny kernel" "$NCU" --profile-from-start off --target-processes all python3 -c "import torch; torch.zeros(1,device='cuda'); torch.cuda.synchronize()" >/dev/null
} > "$OUT/micro.txt" 2>&1
cat "$OUT/micro.txt"
log "cold CLI eval (empty caches)"
export KERNELAGENT_CACHE_DIR=$(mktemp -d)
timeout 120 python3 benchmarks/host_cpu.py --out "$OUT/cold_eval_cpu.json" -- \
  kernelagent eval benchmarks/level1/5_softmax.py benchmarks/solutions/level1/5_softmax.py --json > "$OUT/cold_eval.json"
python3 -c "import json,sys; r=json.load(open('$OUT/cold_eval.json')); print(r['status'], {k: round(v,2) for k,v in r['stage_seconds'].items()}, r.get('kernel_evidence'))"
log "same again, caches warm, new process"
timeout 120 python3 benchmarks/host_cpu.py --out "$OUT/warm_cli_cpu.json" -- \
  kernelagent eval benchmarks/level1/5_softmax.py benchmarks/solutions/level1/5_softmax.py --json > "$OUT/warm_cli_eval.json"
python3 -c "import json,sys; r=json.load(open('$OUT/warm_cli_eval.json')); print(r['status'], {k: round(v,2) for k,v in r['stage_seconds'].items()}, r.get('kernel_evidence'))"
unset KERNELAGENT_CACHE_DIR
log "latency: one server, cold then warm"
timeout 150 python3 benchmarks/eval_latency.py --repeats 3 --out "$OUT/latency.json" 2>&1 | tail -8
log "overlap ($SAMPLES samples)"
timeout 330 python3 benchmarks/host_cpu.py --tree --out "$OUT/overlap_cpu.json" -- \
  python3 benchmarks/bench_throughput.py --overlap --filter 'level1/[1-6]_*' --samples "$SAMPLES" --spinners 0 \
  --out "$OUT/overlap.json" 2>&1 | tail -40
log end
