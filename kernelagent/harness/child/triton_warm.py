"""Triton's per-process set-up, done by our code before a candidate's first call.

A Triton kernel's first call in a fresh process, with the kernel already in TRITON_CACHE_DIR,
spends most of its time in `triton.runtime.cache.triton_key()`, a hash of Triton's own
installation (its sources and its shared library) computed once per process, and importing
`triton.experimental.gluon` from the specialisation (docs/concepts/concurrency.md, "Spare
sessions and Triton's set-up"; benchmarks/triton_first_call.py --profile). Neither depends on
the candidate.
So the harness does both in its own code: the server once (its jobs' processes are forked from
it and inherit the answer), the kernel evidence's target before it says READY (beside the other
jobs, not in the device's slot, where the candidate's first call ran before).

Never on the CPU: under the interpreter Triton compiles nothing, and a CPU server starts leaner.
KERNELAGENT_TRITON_WARM=0 leaves it all to the first call (to measure the difference).
"""

from __future__ import annotations

import time

from kernelagent import settings


def warm() -> float:
    """Import Triton, compute its cache key and import what its first call imports; the seconds
    it took (0.0 where Triton is missing or its layout differs: the first call then pays, as
    before). Idempotent: the key is cached in the process."""
    if not settings.get("KERNELAGENT_TRITON_WARM"):
        return 0.0
    started = time.monotonic()
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
        from triton.runtime.cache import triton_key
    except Exception:  # noqa: BLE001 - no Triton, or another layout: nothing to warm
        return 0.0
    try:
        triton_key()
    except Exception:  # noqa: BLE001 - the first call computes it then
        return 0.0
    try:
        import triton.experimental.gluon  # noqa: F401
    except Exception:  # noqa: BLE001 - older or newer Triton without it
        pass
    return time.monotonic() - started
