#!/usr/bin/env bash
# Issue 55, one device call (about 3 minutes): the kernel tracer (kernelagent/harness/trace)
# built and probed by benchmarks/trace_probe.py: its build time, an honest trace, the start-up
# and timing cost traced vs untraced (alternating fresh processes) and the hostile basics.
# Writes $OUT/summary.json, $OUT/traces.tar.gz (JSON-lines traces, CPU fixtures), $OUT/probe.log.
#   bash scripts/device/trace_probe.sh [pairs] [calls]
set -u -o pipefail
. "$(dirname "$0")/env.sh"
log "environment"
{ gcc --version | head -1; cc --version | head -1
  timeout 60 python3 -c 'import torch,triton,sys;print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__)'
  SP=$(python3 -c 'import site;print(site.getsitepackages()[0])'); echo "site: $SP"
  ls -d "$SP"/nvidia/*/include 2>/dev/null | tr '\n' ' '; echo
  ls "$SP"/nvidia/*/include/cupti.h "$SP"/nvidia/*/lib/libcupti* "$SP"/triton/backends/nvidia/lib/cupti/* 2>&1 | head
  ls /usr/local/cuda/include/cuda.h /usr/local/cuda/extras/CUPTI/lib64/libcupti.so* 2>&1 | head -4
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
} 2>&1 | tee "$OUT/env.txt"
log "probe"
timeout "${PROBE_TIMEOUT:-290}" python3 benchmarks/trace_probe.py --out "$OUT" --pairs "${1:-4}" --calls "${2:-200}" \
  2>&1 | tee "$OUT/probe.log" | cut -c1-3000
echo "rc=$?"
