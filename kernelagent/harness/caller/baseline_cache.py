"""On-disk cache of baseline timings (eager and torch.compile), so that a second candidate
for the same problem neither recompiles nor re-times them.

Keyed by the problem's content hash, the GPU, the driver, torch, triton and python
versions, and every timing setting (seeds and so the input shapes and dtypes follow from
the problem's content). Location: $KERNELAGENT_CACHE_DIR, else
$XDG_CACHE_HOME/kernelagent, else ~/.cache/kernelagent; baselines live in `baselines/`.

Baselines are computed once per problem, not once per GPU: `claim(key)` is an flock on
`baselines/<key>.lock`, so of several evaluators (threads of one bench, or processes on one
host sharing the cache) that miss the same key at once, one times the baselines while the
others wait for its entry. The lock dies with its holder, so a killed evaluator never blocks
the others. The whole cache root is hidden from candidates (the server's --hide).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kernelagent import settings
from kernelagent.harness.config import EvalConfig
from kernelagent.harness.result import ms_or_none

CACHE_FORMAT = 1


def default_cache_dir() -> Path:
    named = settings.get("KERNELAGENT_CACHE_DIR")
    if named is not None:
        return named
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kernelagent"


class BaselineCache:
    def __init__(self, cache_dir: str | Path | None = None):
        self.root = Path(cache_dir) if cache_dir else default_cache_dir()
        self.dir = self.root / "baselines"

    def key(self, problem_sha256: str, fingerprint: dict[str, Any], config: EvalConfig) -> str:
        parts = {
            "format": CACHE_FORMAT,
            "problem": problem_sha256,
            "device": fingerprint.get("gpu_name") or "cpu",
            "driver": fingerprint.get("driver"),
            "torch": fingerprint.get("torch"),
            "triton": fingerprint.get("triton"),
            "python": fingerprint.get("python"),
            "timing": config.timing_key(),
            "compile_modes": sorted(config.compile_modes),
            "compile_on_cpu": config.compile_baseline_on_cpu,
            # baselines timed under the kernel trace (issue 55) are never compared with untraced ones
            "traced": bool((fingerprint.get("trace") or {}).get("library")) and config.trace is not False,
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]

    def get(self, key: str) -> dict[str, Any] | None:
        path = self.dir / f"{key}.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or not isinstance(data.get("timings"), dict):
            return None
        for timing in data["timings"].values():
            # A baseline's device time per call (issue 58) is a finite, positive number of ms, or it
            # is not there: anything else in the file (edited, truncated, older) is dropped.
            if isinstance(timing, dict) and "device_ms" in timing and ms_or_none(timing["device_ms"], positive=True) is None:
                del timing["device_ms"]
        return data

    def put(self, key: str, value: dict[str, Any]) -> None:
        """Atomic write: a reader never sees half a file."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(value, f, indent=1, default=str)
            os.replace(tmp, self.dir / f"{key}.json")
        except OSError:
            pass  # a cache that cannot be written only costs time


    @contextlib.contextmanager
    def claim(self, key: str, wait_s: float) -> Iterator[bool]:
        """Hold the right to compute `key`'s baselines. Yields True once it is ours (the
        caller looks the entry up again first: the holder it waited for may have written it),
        False when the lock could not be taken (no writable cache: compute anyway, unguarded,
        as before) or another holder kept it past `wait_s` (its evaluation hangs: do not wait
        for its deadline too)."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.dir / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            yield False
            return
        # One open file description per claim: flock then excludes the other threads of this
        # process as well as other processes.
        try:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = True
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        held = False
                        break
                    time.sleep(0.05)
                except OSError:
                    held = False
                    break
            yield held
        finally:
            os.close(fd)  # releases the lock
