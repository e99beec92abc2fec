#!/usr/bin/env bash
# Issue 42 on the device (one call, about 4 minutes): memory given back to the driver slows the
# kernels that run next (scrub_probe.py), and the harness's timed loop with the fix (the reference
# keeps its cache between segments; the idle probe waits for quiet bandwidth): KernelBench's 4 ms
# elementwise kernels alone and together, every call's time ($OUT/timing_probe.jsonl).
# Needs KernelBench carried in .kb (carry [".kb"]).
#   bash scripts/device/scrub_run.sh
set -u
. "$(dirname "$0")/env.sh"
if [ -d .kb/KernelBench ] && [ ! -d ../shared/kernelbench/KernelBench ]; then
  mkdir -p ../shared/kernelbench && cp -r .kb/KernelBench ../shared/kernelbench/
fi
log device; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
log "scrub probe"
timeout 200 python3 scripts/device/scrub_probe.py --gb 13 --calls 25 --rounds 2 2>&1 | tail -40
log "harness, alone and together"
timeout 240 python3 scripts/device/timing_probe.py --jobs 4 kb/level1/25_Swish kb/level1/19_ReLU \
  kb/level1/30_Softsign kb/level1/29_Softplus ours/level1/27_batchnorm_eval 2>&1 | tail -24
log end
