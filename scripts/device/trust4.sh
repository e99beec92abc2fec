#!/usr/bin/env bash
# Issue 41 on the device, one call: one `evaluate` over MCP (the SDK's stdio client) on a
# KernelBench level-1 problem, with its latency, then the whole GPU suite; any CUPTI/kineto line
# the run printed is pulled out with its context. Needs .whl (mcp and its needs, cp312) and .kb
# carried: carry [".whl", ".kb"].   bash scripts/device/trust4.sh [suite-seconds] [test files...]
# (with test files: those alone, -m gpu, every test's printed line kept in $OUT/tests.txt)
set -u
. "$(dirname "$0")/env.sh"
SUITE=${1:-470}; shift || true
MCP_ARGS=${MCP_ARGS:-}  # e.g. "--calls evaluate,evaluate --evals 0": the one evaluate the issue asks for
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheels did not install"; exit 1; }
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
if [ -d .kb/KernelBench ] && [ ! -d ../shared/kernelbench/KernelBench ]; then
  mkdir -p ../shared/kernelbench && cp -r .kb/KernelBench ../shared/kernelbench/
fi
log device; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
log "mcp evaluate: level1/19_ReLU"
timeout 150 python3 benchmarks/mcp_latency.py ../shared/kernelbench/KernelBench/level1/19_ReLU.py \
  benchmarks/kernelbench_solutions/level1/19_ReLU.py --out "$OUT/mcp_latency.json" $MCP_ARGS 2>&1 | tee "$OUT/mcp.txt" | tail -20
if [ $# -gt 0 ]; then
  log "gpu tests (${SUITE}s): $*"
  start=$(date +%s)
  timeout -s INT "$SUITE" python3 -m pytest -m gpu -q -s -rfE --tb=short -p no:cacheprovider -o addopts= \
    --durations=10 "$@" > "$OUT/tests.txt" 2>&1
  grep -v "^\s*$" "$OUT/tests.txt" | grep -E "level[123]/|FAILED|ERROR|passed|failed" | cut -c1-400 | tail -60
  echo "tests: $(( $(date +%s) - start )) s wall"
else
  log "gpu suite (${SUITE}s)"
  bash scripts/device/gpu_suite.sh "$SUITE"
fi
log "kineto/CUPTI lines"
grep -n -B3 -A3 -i "registerClient\|CUPTI" "$OUT"/*.txt | cut -c1-300 | head -40
log end
