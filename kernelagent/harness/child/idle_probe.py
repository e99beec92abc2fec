"""The trusted reference's reading of the device before each timed phase (server/gate.py asks):
is another context's work on it, and is its memory bandwidth quiet?

- `spin_us`: a tiny spin, launched and synchronised, IDLE_READS times; another context's kernels
  (a neighbour's, queued before it was stopped) time-slice with it and stretch it to
  milliseconds. Alone on an H100 it takes ~60 us; beside another context's kernels 0.9-2.5 ms
  (measured with a neighbour spinning 2-200 ms kernels).
- `Bandwidth.read_us`: the median device time of an in-place pass (x += 1) over twice the L2.
  Memory any process gives back to the driver is cleared in the background and takes bandwidth
  from it, as from the timed kernels, while the spin reads idle (server/gate.Bandwidth judges).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from kernelagent.harness.child import timing

IDLE_SPIN_CYCLES = 10_000
IDLE_MAX_US = 500.0  # the spin's median within this: no other context's kernels
IDLE_READS = 5
COPY_MIN_BYTES, COPY_MAX_BYTES = 32 << 20, 256 << 20
COPY_WARM, COPY_READS = 2, 7  # the median of COPY_READS timed passes after COPY_WARM


def spin_us(device: torch.device) -> float:
    """The median of IDLE_READS host-clocked spins (0 off CUDA). The median: alone, a read now
    and then pays a context switch (one of 20 read 0.77 ms on an H100); beside a busy context
    every read waits for a time slice."""
    if device.type != "cuda" or timing._cuda_sleep is None:
        return 0.0
    reads = []
    for _ in range(IDLE_READS):
        started = time.perf_counter()
        timing._cuda_sleep(IDLE_SPIN_CYCLES)
        torch.cuda.synchronize(device)
        reads.append((time.perf_counter() - started) * 1e6)
    return float(sorted(reads)[len(reads) // 2])


class Bandwidth:
    """The pass's buffer, made once and kept (a cached block given back would itself be cleared)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.buf: Any = None

    def read_us(self) -> float | None:
        """The median device time (us) of the pass; None off CUDA or where the device has no
        room for the buffer."""
        if self.device.type != "cuda":
            return None
        if self.buf is None:
            l2 = int(getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 0) or 0)
            nbytes = min(max(2 * l2, COPY_MIN_BYTES), COPY_MAX_BYTES)
            try:
                self.buf = torch.zeros(nbytes // 4, dtype=torch.int32, device=self.device)
            except torch.OutOfMemoryError:
                return None
        reads = []
        for i in range(COPY_WARM + COPY_READS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.buf.add_(1)
            end.record()
            end.synchronize()
            if i >= COPY_WARM:
                reads.append(start.elapsed_time(end) * 1e3)
        return float(sorted(reads)[len(reads) // 2])
