#!/usr/bin/env bash
# Issue 58 on the device (NOT YET RUN: no device time was left in the session that wrote it): one
# fresh and one cached eval of the relu problem with a CUDA-graph baseline, printing both clocks
# (per_call, speedups_device, each baseline's device_ms), then the trace's GPU tests.
#   bash scripts/device/clock_run.sh
set -u
. scripts/device/env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export KERNELAGENT_CACHE_DIR=/tmp/kac
P=tests/candidates/relu_problem.py; C=tests/candidates/relu_good.py
log fresh
timeout 240 kernelagent eval $P $C --json --inductor-modes default,reduce-overhead > $OUT/fresh.json 2>$OUT/fresh.err; echo rc=$?
tail -5 $OUT/fresh.err
log cached
timeout 150 kernelagent eval $P $C --inductor-modes default,reduce-overhead > $OUT/cached.txt 2>&1; echo rc=$?
cat $OUT/cached.txt | head -40
python3 - <<'PY'
import json,os
for line in open(os.environ["OUT"]+"/fresh.json"):
    r=json.loads(line)
    print("status",r["status"],r.get("reason","")[:200])
    print("per_call",r.get("per_call"),"clock",r.get("speedup_clock"))
    print("speedups",r.get("speedups"),"device",r.get("speedups_device"))
    print({k:(v.get("median_ms"),v.get("device_ms")) for k,v in r["timings"].items()})
    print("flags",[(f["kind"],f["message"][:120]) for f in r["flags"]])
    print("ev", {k:v for k,v in r.get("kernel_evidence",{}).items() if k!="trace"})
PY
log gputests
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts= -x tests/test_trace_gpu.py 2>&1 | tail -5
