"""Calibrations shared by the servers of one host (issue 59, step 3).

A timed loop's calibration is the empty loop's own cost: the reference process runs the loop of
the candidate's shape with an empty model, and the server subtracts that time from its clock
around the candidate's loop (server/timed.py). Each server keeps them in memory per problem and
loop (`Gate.calibrations`); this store keeps them on disk too, so that another server of the host
(a bench run's next batch, another GPU of the same model, a fresh `eval`) reuses them instead of
holding the timing slot to measure them again.

The calibration's key holds the loop's order, and the order comes from the job's loop plan, which
each server made from its first job's eager time and its free memory (a few percent apart): two
servers timing the same problem ran loops of other lengths, and each measured its own calibration.
So the plan is shared too (`plan-<key>.json`): the first server to make one for a problem writes
it, and every other server of the host runs that plan where it fits its memory, and so reads the
same calibration. A plan is only sizes; read back, it is validated like a calibration.

Two servers' first jobs of a problem reach their slots at about the same time (a batch hands
each server the same problems at once). A server measuring a calibration holds a claim on its key
(`claim-<key>.json`, made exclusively); another server finding that claim fresh runs its candidate's
loop first and reads the calibration after it (server/calibration.py `deferred`), measuring its
own only where none came. The calibration is the same whichever loop ran first: the empty loop,
with the candidate stopped and the device idle.

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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from kernelagent import settings

FORMAT = 1
MAX_SECONDS = 600.0  # no timed loop's calibration takes longer (the timing stage's own limit is less)
# A claim older than this is a server's that died measuring: another server measures instead.
CLAIM_S = 30.0


@dataclass(frozen=True)
class Calibration:
    seconds: float
    recalibrated: bool  # measured twice, the smaller kept (server/timed.py recalibration_wanted)


def _facts(fingerprint: Mapping[str, Any], problem_source: str, settings_: Mapping[str, Any]) -> dict[str, Any]:
    trace = fingerprint.get("trace")
    return {
        "format": FORMAT,
        "gpu": fingerprint.get("gpu_name") or "cpu",
        "driver": fingerprint.get("driver"), "torch": fingerprint.get("torch"),
        "triton": fingerprint.get("triton"), "python": fingerprint.get("python"),
        "traced": isinstance(trace, dict) and bool(trace.get("library")),
        "problem": hashlib.sha256(problem_source.encode()).hexdigest(),
        "settings": dict(settings_),
    }


def key(fingerprint: Mapping[str, Any], *, problem_source: str, settings_: Mapping[str, Any],
        order: Mapping[str, Any]) -> str:
    """The calibration's key: the host-independent facts that change the empty loop's cost."""
    parts = {**_facts(fingerprint, problem_source, settings_), "order": dict(order)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def plan_key(fingerprint: Mapping[str, Any], *, problem_source: str, settings_: Mapping[str, Any],
             output_bytes: int) -> str:
    """The loop plan's key: what the calibration's key holds but the order (the plan is what the
    order comes from), and the size of one output (what a kept call holds)."""
    parts = {**_facts(fingerprint, problem_source, settings_), "plan_for_output_bytes": int(output_bytes)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


PLAN_FIELDS = ("total", "warmup", "keep", "segments", "calls", "budget_bytes")
MAX_PLAN_CALLS = 1 << 24  # more than any config's max_reps; a plan beyond it is not one
MAX_PLAN_BYTES = 1 << 50


def valid_plan(data: object) -> dict[str, int] | None:
    """A loop plan (timed.py loop_plan) read back: exactly its fields, each a non-negative int in
    range, at least one measured call in at least one segment, no more kept than a segment's
    calls, no more calls over the segments than the total; else None."""
    if not isinstance(data, dict) or set(data) != set(PLAN_FIELDS):
        return None
    if not all(isinstance(data[k], int) and not isinstance(data[k], bool) and data[k] >= 0 for k in PLAN_FIELDS):
        return None
    if data["budget_bytes"] > MAX_PLAN_BYTES or any(data[k] > MAX_PLAN_CALLS for k in PLAN_FIELDS[:5]):
        return None
    if min(data["total"], data["segments"], data["calls"]) < 1 or data["keep"] > data["calls"] \
            or data["calls"] * data["segments"] > data["total"]:
        return None
    return {k: int(data[k]) for k in PLAN_FIELDS}


class CalibrationStore:
    """Files `<folder>/<key>.json`, written atomically by servers, read by any server of the host.
    No folder (or the setting off): nothing is read or written."""

    def __init__(self, folder: Path | None, environ: Mapping[str, str] | None = None):
        shared = settings.get("KERNELAGENT_SHARED_CALIBRATION", environ)
        self.folder = Path(folder) if folder is not None and shared else None

    def _path(self, key_: str, prefix: str = "") -> Path | None:
        if self.folder is None or len(key_) != 64 or any(c not in "0123456789abcdef" for c in key_):
            return None
        return self.folder / f"{prefix}{key_}.json"

    def _read(self, path: Path | None) -> Any:
        if path is None or path.is_symlink() or not path.is_file():
            return None
        try:
            with open(path, "rb") as handle:
                return json.loads(handle.read(4096))
        except (OSError, ValueError):
            return None

    def get(self, key_: str) -> Calibration | None:
        """The stored calibration, or None where there is none or it is not one."""
        data = self._read(self._path(key_))
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

    def get_plan(self, key_: str) -> dict[str, int] | None:
        """The loop plan another server of the host made first for this key, or None."""
        data = self._read(self._path(key_, "plan-"))
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        return valid_plan(data.get("plan"))

    def put_plan(self, key_: str, plan: dict[str, int]) -> dict[str, int]:
        """The plan every server of the host runs for this key: the first one written (a link
        that fails where another server's is there already), which is `plan` unless another
        server's came first. Without the store, or on a failure: `plan` itself."""
        path = self._path(key_, "plan-")
        if path is None or valid_plan(plan) is None:
            return plan
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"format": FORMAT, "plan": plan}))
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        except OSError:
            return plan
        return self.get_plan(key_) or plan

    def claim(self, key_: str) -> bool:
        """True where this server is to measure the calibration of `key_` (it now holds the claim,
        or there is no store); False where another server of the host holds a fresh claim on it."""
        path = self._path(key_, "claim-")
        if path is None:
            return True
        for _ in range(2):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600))
                return True
            except FileExistsError:
                if self.claimed(key_):
                    return False
                try:  # a stale claim (its server died measuring): taken over
                    path.unlink()
                except OSError:
                    return True
            except OSError:
                return True
        return True

    def claimed(self, key_: str) -> bool:
        """Does a server of the host hold a fresh claim on measuring `key_`?"""
        path = self._path(key_, "claim-")
        try:
            return path is not None and time.time() - path.lstat().st_mtime < CLAIM_S
        except OSError:
            return False

    def release(self, key_: str) -> None:
        path = self._path(key_, "claim-")
        if path is not None:
            try:
                path.unlink()
            except OSError:
                pass
