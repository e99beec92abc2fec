#!/usr/bin/env bash
# Issue 42, the next device call (about 3 minutes): our 27_batchnorm_eval's first call of each
# 2-call segment read slow in some H100 runs (0.0851 against 0.0730 ms), the agreement table's one
# miss. segment_probe.py drives the harness's timer segment by segment as the server does, with
# and without stopping the process between segments, for three launch covers; then the harness
# itself on it, three times with the default cover and three with 400 us.
#   bash scripts/device/segment_run.sh
set -u
. "$(dirname "$0")/env.sh"
log device; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
log "segment probe, stopped between segments"
timeout 120 python3 scripts/device/segment_probe.py --segments 64 --gap-ms 3 --covers 150,300,600 2>&1 | tail -5
log "segment probe, not stopped"
timeout 120 python3 scripts/device/segment_probe.py --segments 64 --gap-ms 3 --covers 150,300 --no-stop 2>&1 | tail -4
log "harness, default cover"
timeout 150 python3 scripts/device/timing_probe.py --jobs 1 ours/level1/27_batchnorm_eval ours/level1/27_batchnorm_eval \
  ours/level1/27_batchnorm_eval 2>&1 | tail -6
log "harness, cover 400 us"
timeout 150 python3 scripts/device/timing_probe.py --jobs 1 --set launch_cover_us=400 ours/level1/27_batchnorm_eval \
  ours/level1/27_batchnorm_eval ours/level1/27_batchnorm_eval 2>&1 | tail -6
log end
