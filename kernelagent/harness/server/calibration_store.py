"""Calibrations shared by the servers of one host (issue 59, step 3).

A timed loop's calibration is the empty loop's own cost: the reference process runs the loop of
the candidate's shape with an empty model, and the server subtracts that time from its clock
around the candidate's loop (server/timed.py). Each server keeps them in memory per problem and
loop (`Gate.calibrations`); this store keeps them on disk too, so that another server of the host
(a bench run's next batch, another GPU of the same model, a fresh `eval`) reuses them instead of
holding the timing slot to measure them again.

Why sharing one is safe: a calibration is measured by our reference process, never by a
candidate's, with the job's candidate stopped and its queued kernels drained first, and the device
idle by the trusted probe. A candidate cannot influence a calibration it never runs beside, and
another server's jobs cannot run beside it either (the device lock: server/device_lock.py). The
store lives under the caller's cache root, which every job's jail hides; what is read back is
validated (a finite number of seconds in range), and its key holds everything that could change
the empty loop's cost: the GPU model, driver, torch, Triton and Python, whether the processes
are traced, the problem's source, the timing settings and the loop's order. A key never read
across GPU models or problems. `KERNELAGENT_SHARED_CALIBRATION=0` keeps them private to a
server, for measuring that sharing changes no timing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from kernelagent import settings

FORMAT = 1
MAX_SECONDS = 600.0  # no timed loop's calibration takes longer (the timing stage's own limit is less)


@dataclass(frozen=True)
class Calibration:
    seconds: float
    recalibrated: bool  # measured twice, the smaller kept (server/timed.py recalibration_wanted)


def key(fingerprint: Mapping[str, Any], *, problem_source: str, settings_: Mapping[str, Any],
        order: Mapping[str, Any]) -> str:
    """The calibration's key: the host-independent facts that change the empty loop's cost."""
    trace = fingerprint.get("trace")
    parts = {
        "format": FORMAT,
        "gpu": fingerprint.get("gpu_name") or "cpu",
        "driver": fingerprint.get("driver"), "torch": fingerprint.get("torch"),
        "triton": fingerprint.get("triton"), "python": fingerprint.get("python"),
        "traced": isinstance(trace, dict) and bool(trace.get("library")),
        "problem": hashlib.sha256(problem_source.encode()).hexdigest(),
        "settings": dict(settings_), "order": dict(order),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class CalibrationStore:
    """Files `<folder>/<key>.json`, written atomically by servers, read by any server of the host.
    No folder (or the setting off): nothing is read or written."""

    def __init__(self, folder: Path | None, environ: Mapping[str, str] | None = None):
        shared = settings.get("KERNELAGENT_SHARED_CALIBRATION", environ)
        self.folder = Path(folder) if folder is not None and shared else None

    def _path(self, key_: str) -> Path | None:
        if self.folder is None or len(key_) != 64 or any(c not in "0123456789abcdef" for c in key_):
            return None
        return self.folder / f"{key_}.json"

    def get(self, key_: str) -> Calibration | None:
        """The stored calibration, or None where there is none or it is not one."""
        path = self._path(key_)
        if path is None or path.is_symlink() or not path.is_file():
            return None
        try:
            with open(path, "rb") as handle:
                data = json.loads(handle.read(4096))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        seconds, again = data.get("seconds"), data.get("recalibrated")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
                or not 0 < seconds <= MAX_SECONDS or not isinstance(again, bool):
            return None
        return Calibration(float(seconds), again)

    def put(self, key_: str, calibration: Calibration) -> None:
        """Write it (atomically: a reader never sees half a file); a failure costs only the reuse."""
        path = self._path(key_)
        if path is None or not math.isfinite(calibration.seconds) or not 0 < calibration.seconds <= MAX_SECONDS:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"format": FORMAT, "seconds": calibration.seconds,
                                       "recalibrated": calibration.recalibrated}))
            os.replace(tmp, path)
        except OSError:
            pass
