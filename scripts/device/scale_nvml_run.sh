#!/usr/bin/env bash
# Issue 44, after the jobs' CUDA start-up stopped asking NVML for the device count (child/common.py
# count_devices_through_cuda), on a two-GPU machine in one call of about 7 minutes: torch's
# device_count as this machine has it, the GPU test of a start without NVML, scale_run.sh (1 GPU
# against 2 on the same candidates: the evaluations re-run alone should be none), then the kernel
# evidence's GPU tests (ncu_entry.py starts the same way). The JSON lands in $OUT.
#   bash scripts/device/scale_nvml_run.sh [samples]
set -u
. "$(dirname "$0")/env.sh"
SAMPLES=${1:-6}
log "torch.cuda.device_count here"
timeout 30 python3 -c "import inspect, torch, torch.cuda as c; print(torch.__version__); print(inspect.getsource(c.device_count))" \
  2>&1 | grep -v '^ *"""\|^ *r"""\|^ *\.\. note\|^ *Return the\|See :ref' | head -30
log "pytest -m gpu tests/test_child_start.py"
timeout 120 python3 -m pytest -q -m gpu tests/test_child_start.py -p no:cacheprovider 2>&1 | tail -3
log "scale_run.sh $SAMPLES"
BENCH_TIMEOUT=${BENCH_TIMEOUT:-420} bash "$(dirname "$0")/scale_run.sh" "$SAMPLES" 'level1/[1-6]_*' ''
log "pytest -m gpu tests/test_kernel_evidence_gpu.py"
timeout "${EVIDENCE_TIMEOUT:-100}" python3 -m pytest -q -m gpu tests/test_kernel_evidence_gpu.py -p no:cacheprovider 2>&1 | tail -4
log end
