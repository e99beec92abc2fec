#!/usr/bin/env bash
# The whole GPU test suite in one device call (issue 39: <= 6 minutes). Needs KernelBench carried
# in .kb (carry [".kb"]): it is put where the tests look (../shared/kernelbench).
#   bash scripts/device/gpu_suite.sh [seconds]
# One GPU: every file in one pytest. Two or more: the KernelBench sweep (its own server, about
# 3 minutes of the suite) on the second GPU beside the rest on the first: each server has its own
# device and device lock, so neither times beside the other's work.
# Each test's line is written as it ends (-v, tee'd to $OUT), so a run cut by its limit still
# says how far it got, each line prefixed with the seconds since the suite's start; the pytest is
# killed 20 s after its interrupt.
set -u
. "$(dirname "$0")/env.sh"
LIMIT=${1:-470}
if [ -d .kb/KernelBench ] && [ ! -d ../shared/kernelbench/KernelBench ]; then
  mkdir -p ../shared/kernelbench && cp -r .kb/KernelBench ../shared/kernelbench/
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
start=$(date +%s)
run() {  # run NAME pytest-args...
  local name=$1; shift
  timeout -s INT -k 20 "$LIMIT" python3 -m pytest -m gpu -v -rfE --tb=short -p no:cacheprovider -o addopts= \
    --durations=25 "$@" 2>&1 | while IFS= read -r line; do echo "$(( $(date +%s) - start )) $line"; done > "$OUT/$name.txt"
  echo "$name: rc ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s"
}
REST=$(ls tests/test_*gpu*.py)
if [ "$GPUS" -ge 2 ]; then
  CUDA_VISIBLE_DEVICES=1 run gpu_suite_kernelbench tests/test_kernelbench_solutions.py &
  CUDA_VISIBLE_DEVICES=0 run gpu_suite_rest $REST
  wait
  parts="gpu_suite_rest gpu_suite_kernelbench"
else
  run gpu_suite $REST tests/test_kernelbench_solutions.py
  parts=gpu_suite
fi
for p in $parts; do
  echo "== $p"; grep -E "FAILED|ERROR" "$OUT/$p.txt" | head -20; grep -A27 "slowest 25" "$OUT/$p.txt" | head -28
  tail -1 "$OUT/$p.txt"
done
echo "gpu suite: $(( $(date +%s) - start )) s wall on $GPUS GPU(s)"
