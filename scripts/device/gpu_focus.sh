#!/usr/bin/env bash
# Chosen GPU test files in one call, in the order given (the ones most at risk first), with KernelBench
# carried in .kb (carry [".kb"]).   bash scripts/device/gpu_focus.sh SECONDS FILE...
set -u
. "$(dirname "$0")/env.sh"
LIMIT=${1:-400}; shift
if [ -d .kb/KernelBench ] && [ ! -d ../shared/kernelbench/KernelBench ]; then
  mkdir -p ../shared/kernelbench && cp -r .kb/KernelBench ../shared/kernelbench/
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
start=$(date +%s)
set -o pipefail
timeout -s INT "$LIMIT" python3 -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider -o addopts= --durations=10 \
  "$@" 2>&1 | tee "$OUT/gpu_focus.txt" | tail -40
echo "gpu focus: $(( $(date +%s) - start )) s wall"
