#!/usr/bin/env bash
# The GPU suite without the KernelBench batch (tests/test_kernelbench_solutions.py, its own call:
# gpu_focus.sh), then the memory probe of full-size KernelBench solutions run alone.
#   bash scripts/device/suite_rest.sh [seconds]   (carry [".kb"])
set -u
. "$(dirname "$0")/env.sh"
LIMIT=${1:-360}
if [ -d .kb/KernelBench ] && [ ! -d ../shared/kernelbench/KernelBench ]; then
  mkdir -p ../shared/kernelbench && cp -r .kb/KernelBench ../shared/kernelbench/
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
start=$(date +%s)
timeout -s INT "$LIMIT" python3 -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider -o addopts= --durations=15 \
  tests/test_*gpu*.py 2>&1 | tee "$OUT/gpu_rest.txt" | tail -40
echo "gpu suite without KernelBench: $(( $(date +%s) - start )) s wall"
log memory probe
timeout -s INT 120 python3 scripts/device/memory_probe.py 2>&1 | tee "$OUT/memory_probe.txt" | grep -v Warning | tail -12
echo "total: $(( $(date +%s) - start )) s wall"
