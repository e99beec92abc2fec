#!/usr/bin/env bash
# Issue 42, one device call (about 6 minutes): our 27_batchnorm_eval through the harness three
# times (each 2-call segment's first call now has the longer cover, child/timing.FIRST_COVER_FACTOR),
# then the agreement table (fidelity_run.sh agreement). Needs KernelBench carried in .kb.
#   bash scripts/device/agreement_run.sh [minutes] [jobs]
set -u
. "$(dirname "$0")/env.sh"
log "harness, batchnorm (first-call cover)"
timeout 120 python3 scripts/device/timing_probe.py --jobs 1 ours/level1/27_batchnorm_eval \
  ours/level1/27_batchnorm_eval ours/level1/27_batchnorm_eval 2>&1 | tail -4
bash "$(dirname "$0")/fidelity_run.sh" agreement "${1:-6}" "${2:-8}"
