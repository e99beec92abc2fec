#!/usr/bin/env bash
# Issue 42 on the device: one of the two tables per call (each at most 8 minutes, KernelBench
# level 1 included), many evaluations in flight in one server, timed loops and profiles alone on
# the device. Needs KernelBench carried in .kb (carry [".kb"]).
#   bash scripts/device/fidelity_run.sh agreement [minutes] [jobs]   # profiler_agreement.py --suite both
#   bash scripts/device/fidelity_run.sh fidelity [minutes] [jobs]    # fidelity.py, warm and fresh
# (fidelity: REPS, FRESH, PRIME_JOBS and FRESH_JOBS in the environment override 6, 2, 4 and 3)
set -u
. "$(dirname "$0")/env.sh"
WHAT=${1:-agreement}; MINUTES=${2:-7}; JOBS=${3:-8}
if [ -d .kb/KernelBench ] && [ ! -d ../shared/kernelbench/KernelBench ]; then
  mkdir -p ../shared/kernelbench && cp -r .kb/KernelBench ../shared/kernelbench/
fi
log device; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
LIMIT=$(( MINUTES * 60 + 60 ))
case "$WHAT" in
  agreement)
    timeout -s INT "$LIMIT" python3 benchmarks/profiler_agreement.py --suite both --max-minutes "$MINUTES" \
      --jobs "$JOBS" --out "$OUT/agreement.jsonl" --summary "$OUT/agreement.md" 2>&1 | tail -80 ;;
  fidelity)
    timeout -s INT "$LIMIT" python3 benchmarks/fidelity.py --cache on --reps "${REPS:-6}" --fresh "${FRESH:-2}" \
      --max-minutes "$MINUTES" --jobs "$JOBS" --prime-jobs "${PRIME_JOBS:-4}" --fresh-jobs "${FRESH_JOBS:-3}" \
      --out "$OUT/fidelity.jsonl" --summary "$OUT/fidelity.md" 2>&1 | tail -80 ;;
  *) echo "usage: fidelity_run.sh agreement|fidelity [minutes] [jobs]"; exit 2 ;;
esac
log end
