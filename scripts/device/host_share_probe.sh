#!/usr/bin/env bash
# Issue 59: what the two servers of a two-GPU row share on the host. The CPU topology (are the
# CPUs of one server's half hyperthread siblings of the other half's?), then one process per CPU
# of a pure-Python loop and of a 256 MiB memory copy: on the first half alone, then on every CPU.
# A per-process time that grows when the second half is busy is a shared core (or memory bus), not
# the driver's lock.   bash scripts/device/host_share_probe.sh
set -u
. "$(dirname "$0")/env.sh"
N=$(nproc); HALF=$((N / 2))
lscpu | grep -Ei 'model name|thread|core|socket|numa|L3' | head -10
echo "cpu0 siblings: $(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list)," \
  "cpu$HALF siblings: $(cat /sys/devices/system/cpu/cpu$HALF/topology/thread_siblings_list)"
cat > /tmp/spin.py <<'PY'
import sys, time
t = time.perf_counter()
if sys.argv[1] == "cpu":
    x = 0
    for i in range(12_000_000):
        x += i * i % 7
else:
    import numpy as np
    a = np.ones(64 << 20, dtype=np.float32); b = np.empty_like(a)
    for _ in range(20):
        np.copyto(b, a)
print(f"{time.perf_counter() - t:.3f}")
PY
for kind in cpu mem; do
  for n in $HALF $N; do
    times=$(for c in $(seq 0 $((n - 1))); do taskset -c "$c" timeout 60 python3 /tmp/spin.py $kind & done; wait)
    echo "$kind on $n CPUs: $(echo "$times" | sort -n | awk '{a[NR]=$1; s+=$1} END {printf "mean %.3f s, min %.3f, max %.3f", s/NR, a[1], a[NR]}')"
  done
done
