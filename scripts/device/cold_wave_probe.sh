#!/usr/bin/env bash
# Issue 42, the next device call (about 4 minutes): why do the later jobs of a cold wave hang?
# On an H100 (2026-11-27) the last-forked jobs of a wave of 8 cold evaluations in one server ran
# past their 60 s 'start' limit with both processes still named ka-server (forked, never at their
# first line), in state R, with 0.0 and 0.3-0.7 CPU-seconds: then they were re-run alone, one by
# one. This runs such a wave (fidelity.py's primes, 8 at once) while a watchdog dumps, every 10 s,
# each of the server's children still named ka-server after 15 s: its /proc status, scheduler
# statistics and kernel stack, and py-spy's Python and native stacks. Needs KernelBench in .kb and
# py-spy's wheel in .whl (carry [".kb", ".whl"]):
#   python3 -m pip download --no-deps --only-binary=:all: --platform manylinux1_x86_64 -d .whl py-spy
#   bash scripts/device/cold_wave_probe.sh
# With FULL=1 the wave is the start of the whole fidelity table (REPS, FRESH and MINUTES as
# fidelity_run.sh takes them, 6, 2 and 7 by default), the watchdog running beside it throughout.
set -u
. "$(dirname "$0")/env.sh"
if ls .whl/py_spy-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/py_spy-*.whl \
    && export PATH="/tmp/site/bin:$PATH"
fi
command -v py-spy >/dev/null || echo "py-spy not found: no Python stacks"

watch() {  # every 10 s: the server's children still named ka-server after 15 s
  local end=$((SECONDS + ${1:-240}))
  while [ "$SECONDS" -lt "$end" ]; do
    for status in /proc/[0-9]*/status; do
      pid=${status#/proc/}; pid=${pid%/status}
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = ka-server ] || continue
      ppid=$(awk '/^PPid:/ {print $2}' "$status" 2>/dev/null)
      [ "$(cat "/proc/$ppid/comm" 2>/dev/null)" = ka-server ] || continue
      age=$(ps -o etimes= -p "$pid" 2>/dev/null | tr -d ' ')
      [ -n "$age" ] && [ "$age" -ge 15 ] || continue
      echo "== $(date +%T) pid $pid (parent $ppid) age ${age}s"
      grep -E '^(State|Threads|Cpus_allowed_list|voluntary|nonvoluntary|SigBlk|SigPnd|ShdPnd)' "$status"
      grep -E '^(se.sum_exec_runtime|se.statistics.wait_sum|nr_switches|se.exec_start|policy|prio)' \
        "/proc/$pid/sched" 2>/dev/null
      head -12 "/proc/$pid/stack" 2>/dev/null
      command -v py-spy >/dev/null && timeout 20 py-spy dump --native --pid "$pid" 2>&1 | head -60
    done
    sleep 10
  done
}

log device; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${FULL:-0}" = 1 ]; then
  MINUTES=${MINUTES:-7}
  watch $((MINUTES * 60 + 30)) > "$OUT/watch.log" 2>&1 &
  WATCH=$!
  PRIME_JOBS=8 timeout $((MINUTES * 60 + 70)) bash "$(dirname "$0")/fidelity_run.sh" fidelity "$MINUTES" 8
else
  watch 250 > "$OUT/watch.log" 2>&1 &
  WATCH=$!
  REPS=1 FRESH=0 PRIME_JOBS=8 timeout 280 bash "$(dirname "$0")/fidelity_run.sh" fidelity 3 8 | grep -v '^|'
fi
kill "$WATCH" 2>/dev/null
log "watchdog: $(grep -c '^== ' "$OUT/watch.log") dumps"
head -c 20000 "$OUT/watch.log"
log end
