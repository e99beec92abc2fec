#!/usr/bin/env bash
# Issue 42, next step on the device (one call, about 5 minutes): why the harness's timed loop runs
# KernelBench's 4 ms elementwise kernels at two speeds (4.29 and 4.98 ms on an H100, 2026-11-27),
# and where an honest host-heavy kernel's extra server-clock time comes from.
#   1. placement_probe.py --loop: a loop shaped like the harness's, each part switched off in turn,
#      every call's time with its buffers' addresses ($OUT/placement_loop.jsonl);
#   2. timing_probe.py --variants: the harness itself, with the flush, the launch cover and the
#      defences off in turn ($OUT/timing_probe.jsonl).
# Needs KernelBench carried in .kb (carry [".kb"]).
#   bash scripts/device/loop_probe.sh
set -u
. "$(dirname "$0")/env.sh"
if [ -d .kb/KernelBench ] && [ ! -d ../shared/kernelbench/KernelBench ]; then
  mkdir -p ../shared/kernelbench && cp -r .kb/KernelBench ../shared/kernelbench/
fi
log device; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for flags in "" "--no-flush" "--no-kept" "--reuse-input" "--no-flush --no-kept --reuse-input"; do
  log "placement loop $flags"
  # shellcheck disable=SC2086
  timeout 60 python3 scripts/device/placement_probe.py --loop --calls 40 $flags 2>&1 | head -12
done
log "harness variants"
timeout 320 python3 scripts/device/timing_probe.py --jobs 4 --variants kb/level1/25_Swish kb/level1/19_ReLU \
  kb/level1/30_Softsign ours/level1/27_batchnorm_eval 2>&1 | cut -c1-600 | tail -40
log end
