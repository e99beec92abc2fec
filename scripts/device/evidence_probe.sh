#!/usr/bin/env bash
# Issue 39 on the device: the kernel evidence's phases outside any server (benchmarks/evidence_phases.py):
# Triton's own first call without ncu, the session as the server runs it with 2 and 1 profiled
# calls, and whether a freeze (SIGSTOP of the whole session) during the warm-up is survived.
#   bash scripts/device/evidence_probe.sh [repeats]
set -u
. "$(dirname "$0")/env.sh"
REPEATS=${1:-3}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 400 python3 benchmarks/evidence_phases.py --repeats "$REPEATS" --calls 2,1 --variants plain,ncu,stop \
  --out "$OUT/phases.json" 2>&1 | tee "$OUT/phases.txt" | cut -c1-900
echo "rc=$?"
