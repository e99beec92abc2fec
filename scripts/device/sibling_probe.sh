#!/usr/bin/env bash
# Issue 59: which CPUs of the device machine share a physical core although lscpu says one thread
# per core (a VM's hidden siblings). For CPUs 0 and 5: a pure-Python loop alone, then beside the
# same loop on every other CPU in turn; a partner that slows it by a third or more is a sibling.
#   bash scripts/device/sibling_probe.sh
set -u
N=$(nproc)
cat > /tmp/spin1.py <<'PY'
import time
t = time.perf_counter()
x = 0
for i in range(6_000_000):
    x += i * i % 7
print(f"{time.perf_counter() - t:.3f}")
PY
for a in 0 5; do
  alone=$(taskset -c $a python3 /tmp/spin1.py)
  line="cpu $a alone $alone s; beside:"
  for b in $(seq 0 $((N - 1))); do
    [ "$b" = "$a" ] && continue
    taskset -c $b python3 /tmp/spin1.py > /dev/null & other=$!
    t=$(taskset -c $a python3 /tmp/spin1.py); wait $other
    line="$line $b:$t"
  done
  echo "$line"
done
