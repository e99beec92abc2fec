"""The timed loop's calibration (a stage object of server/timed.py's TimedLoop): the server's
clock around the trusted reference running the candidate's loop with an empty model, segment by
segment, so the loop's own cost is taken off the candidate's time. Measured once per problem and
loop order in a server and reused (gate.calibrations); measured again, at most once on a GPU,
when the candidate's claim falls short of the server's time (recalibration_wanted), the smaller
of the two counting. It gets the job through seams.CalibrationJob."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kernelagent.harness import protocol
from kernelagent.harness.loop_order import LoopOrder
from kernelagent.harness.server.calibration_store import Calibration as StoredCalibration
from kernelagent.harness.server import verdict
from kernelagent.harness.server.gate import add_seconds
from kernelagent.harness.server.stages import ReferenceGone

# At most this long after the candidate's loop, a deferred calibration waits for the other
# server's (which began before this job's loop did, so is nearly always there already).
WAIT_S = 2.0

if TYPE_CHECKING:
    from kernelagent.harness.server.seams import CalibrationJob


class Calibration:
    """The empty loop's cost, for one job's timed loop."""

    def __init__(self, job: CalibrationJob):
        self.job = job
        self.shared = False  # the calibration came from another server of this host (the store)
        # another server of the host was measuring this loop's calibration when this job's slot
        # began: the candidate's loop runs first, and `after_loop` reads it (calibration_store.py)
        self.deferred = False

    def calibrate(self, order: LoopOrder, segments: int, deadline: float) -> float | None:
        """The server's clock around the reference process running the timed loop with an empty
        model, segment by segment as the candidate's loop: the loop's own cost, in seconds. None
        when the reference could not run it (out of memory beside the candidate's kept outputs,
        on a second run), which the reference reports instead of dying."""
        job = self.job
        # The candidate's processes are stopped meanwhile: work of theirs beside the empty loop
        # would inflate the loop's measured cost, and so shrink the time charged to the candidate.
        stopped = job.stop_candidate(True)
        try:
            if job.hold is not None:
                job.hold.wait_idle()  # kernels the candidate queued before it was stopped, drained
            protocol.send(job.to_ref, "calibrate", job.job_id, job.ref_nonce, seed=job.rng.getrandbits(40),
                          **order.fields())
            if job.channels.ref_recv({"warmed", "calibrated"}, deadline)["type"] == "calibrated":
                return None
            total = 0.0
            for _ in range(segments):
                protocol.send(job.to_ref, "go", job.job_id, job.ref_nonce, seed=job.rng.getrandbits(40))
                t0 = time.perf_counter()
                message = job.channels.ref_recv({"calibrated"}, deadline)
                if message["seconds"] < 0:
                    return None
                # the bytes of its kept (empty) outputs, as the candidate's come (order["payloads"])
                for size in message["payload_bytes"]:
                    protocol.recv_payload(job.to_ref, max_bytes=max(int(size), 1))
                total += time.perf_counter() - t0
            return total
        finally:
            if stopped:
                job.stop_candidate(False)

    def first(self, order: LoopOrder, *, segments: int, deadline: float, key: str) -> tuple[float | None, bool]:
        """The loop's own cost (s), measured or reused from an earlier job of the same order (of
        this server, or on a GPU of another server of this host: gate.calibration_store), and
        whether it was reused; None where neither a GPU nor the defences ask for it, or where
        another server measures it now (`deferred`: `after_loop` has it)."""
        job = self.job
        if not (job.fingerprint.get("cuda") or job.config.defences):
            return None, False
        calibration_s = job.gate.calibrations.get(key)
        if calibration_s is not None:
            return calibration_s, True
        shared = job.gate.calibration_store.get(key)  # another server's (none on the CPU: make_gate)
        if shared is not None:
            return self._adopt(key, shared), True
        store = job.gate.calibration_store
        if not store.claim(key):  # another server measures it now: read after this job's loop
            self.deferred = True
            return None, False
        try:
            return self._measure(order, segments=segments, deadline=deadline, key=key), False
        finally:
            store.release(key)

    def after_loop(self, order: LoopOrder, *, segments: int, deadline: float, key: str) -> tuple[float, bool]:
        """A deferred calibration, once the candidate's loop has run: the other server's (waited
        for while its claim stays fresh, at most WAIT_S more), else measured here; and whether it
        was another's."""
        job = self.job
        store = job.gate.calibration_store
        waiting = time.monotonic()
        while True:
            shared = store.get(key)
            if shared is not None:
                add_seconds(job.concurrency, "slot_calibration_s", time.monotonic() - waiting)
                return self._adopt(key, shared), True
            if not store.claimed(key) or time.monotonic() - waiting > WAIT_S:
                break
            time.sleep(0.02)
        add_seconds(job.concurrency, "slot_calibration_s", time.monotonic() - waiting)
        return self._measure(order, segments=segments, deadline=deadline, key=key), False

    def _adopt(self, key: str, shared: StoredCalibration) -> float:
        """Another server's stored calibration, kept as this server's (its second measure too)."""
        gate = self.job.gate
        gate.calibrations[key] = shared.seconds
        if shared.recalibrated:
            gate.recalibrated.add(key)
        self.shared = True
        return shared.seconds

    def _measure(self, order: LoopOrder, *, segments: int, deadline: float, key: str) -> float:
        job = self.job
        calibrating = time.monotonic()
        calibration_s = self.calibrate(order, segments, deadline)
        add_seconds(job.concurrency, "slot_calibration_s", time.monotonic() - calibrating)
        if calibration_s is None:
            raise ReferenceGone("ran out of device memory running the empty timed loop (calibration)")
        job.gate.calibrations[key] = calibration_s
        job.gate.calibration_store.put(key, StoredCalibration(calibration_s, False))
        return calibration_s

    def recalibrate(self, order: LoopOrder, *, segments: int, deadline: float, first_s: float,
                    key: str) -> float:
        """The calibration measured again; the smaller of the two counts (and is kept for reuse).
        Where another server of the host has measured it twice already, its smaller measure
        (or this job's first, if smaller) counts instead, without a measure here."""
        job = self.job
        # Noise only ever adds time, and a slow calibration both shrinks the server's time and
        # widens the slack, enough to let a forged clock through once on a busy CPU. So when
        # the claim falls short of the server's time, the calibration runs again and the
        # smaller one counts (an honest candidate's claim matches, and pays nothing).
        calibration_s = first_s
        stored = job.gate.calibration_store.get(key)
        if stored is not None and stored.recalibrated:
            # another server of the host measured it twice already: the smaller of its two, or
            # of this job's first where that is smaller, counts (no third measure in the slot)
            calibration_s = min(first_s, stored.seconds)
            job.facts.timed_loop["calibrations_s"] = [first_s, stored.seconds]
            job.facts.timed_loop["recalibration_shared"] = True
            job.facts.timed_loop["calibration_s"] = calibration_s
            job.gate.calibrations[key] = calibration_s
            job.gate.recalibrated.add(key)
            return calibration_s
        calibrating = time.monotonic()
        again = self.calibrate(order, segments, deadline)
        add_seconds(job.concurrency, "slot_calibration_s", time.monotonic() - calibrating)
        job.facts.timed_loop["calibrations_s"] = [calibration_s, again]
        if again is not None:
            calibration_s = min(calibration_s, again)
            job.facts.timed_loop["calibration_s"] = calibration_s
            job.gate.calibrations[key] = calibration_s
            job.gate.recalibrated.add(key)  # measured twice: see recalibration_wanted
            job.gate.calibration_store.put(key, StoredCalibration(calibration_s, True))
        return calibration_s

    def recalibration_wanted(self, key: str, samples: list[Any], measured: int, loop_s: float,
                             calibration_s: float) -> bool:
        """verdict.needs_recalibration, at most once per loop on a GPU: a many-segment loop's
        honest claim always falls short of the server's time by its per-segment cost, so every
        job recalibrated and the reuse saved nothing (docs/concepts/concurrency.md, "Where an
        evaluation's time and the host's CPU go"). The smaller of the two measures is kept and
        reused after that. On the CPU (a busy runner's noise) every job may still recalibrate."""
        if self.job.fingerprint.get("cuda") and key in self.job.gate.recalibrated:
            return False
        return verdict.needs_recalibration(samples, measured, loop_s, calibration_s)
