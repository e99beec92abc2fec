"""The candidate's timed loop (`TimedLoop`, the job's `timed` stage; it gets the job as
seams.TimedJob), with its calibration (server/calibration.py, `TimedLoop.calibration`).

It runs inside the device's gate (server/gate.py): every other job of the server is stopped,
the device is probed idle by the trusted reference, and the job's own stage clock runs only
while it holds the slot. The loop is clocked here, from outside the candidate's process,
against a calibration loop the reference runs with an empty model.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from kernelagent.settings import BY_NAME, get as setting
from kernelagent.harness import protocol
from kernelagent.harness.child import memory_plan
from kernelagent.harness.server import draws, verdict
from kernelagent.harness.loop_order import LoopOrder
from kernelagent.harness.server import calibration_store
from kernelagent.harness.server.calibration import Calibration
from kernelagent.harness.server.gate import add_seconds

if TYPE_CHECKING:
    from kernelagent.harness.config import EvalConfig
    from kernelagent.harness.server.record_types import EmptyCallClaim, TimingRecord
    from kernelagent.harness.server.seams import TimedJob

# Outputs of timed calls kept for verification: at most this many calls, within this share of
# free device memory (or this many bytes on the CPU).
MAX_KEPT_CALLS = 1000
# The least a process may keep on a GPU, within the memory plan's per-process margin
# (memory_plan.MARGIN_BYTES, 512 MiB, reserved already). Too small a floor splits a small
# kernel's loop into many segments of few calls, and the candidate's per-segment cost beyond the
# calibration's then reads as work per call: honest runs flagged clock-mismatch
# (docs/concepts/timing.md, "Measurements behind the code").
# (memory_plan.HARNESS_FLOOR, with the share of free memory in memory_plan.HARNESS_SHARE.)
KEEP_CPU_BYTES: int = BY_NAME["KERNELAGENT_CPU_KEEP_BYTES"].default
# Settings that change no timed loop (which results are audited): left out of the loop's plan and
# calibration keys, so that an audited evaluation reuses what an unaudited one of the same loop measured.
LOOP_NEUTRAL = ("seed", "trials", "timeouts", "audit", "audit_wins", "audit_share")
TIMED_CHECKS = 3  # timed calls verified on average, drawn in secret over the whole loop (the last one too)
# A loop of huge outputs (few kept per segment) stops here. Each segment is a round trip through the
# server (the candidate stopped, its chosen calls compared, continued) beside its calls' launch
# covers: at 256, a 256 MiB softmax output (2 kept) ran 512 calls in 256 segments, 0.77 s of loop
# and 0.43 s of comparisons for 68 ms of kernels in a warm `eval` (H200). 128 segments still give
# the server's clock as many readings as the candidate's samples need (docs/concepts/timing.md).
MAX_SEGMENTS = 128
# The server reads the SM clock around the candidate's loop only where NVML starts faster than
# this (measured by the device probe): it opens and closes NVML around each loop.
NVML_INIT_MAX_MS = 200.0
# The least time a timed loop may hold the device's slot beside other jobs (see _timed_loop).
SLOT_MIN_S = 15.0
SLOT_SEGMENT_S = 5.0
# The loop runs in at least this many segments (where it has that many calls): the server clocks
# each one itself, so its own per-segment times give a distribution the candidate's reported
# samples are checked against (issue 24, class 2), not one total.
MIN_SEGMENTS = 8



# A call the candidate reports may take at most the server's whole segment around it, this much
# more for the clocks' own disagreement.
SAMPLE_SLACK = 1.05
SAMPLE_SLACK_MS = 1.0


def check_samples(samples_ms: list[Any], segment_s: float) -> None:
    """Every time the candidate's process reports for one segment's calls is a number, finite,
    above zero and no longer than the server's own clock around the whole segment (a call runs
    inside it): else `rejected: protocol`. All-negative samples were a harness error with the
    defences off and `correct` with a review flag with them on; samples of 1e308 were believed
    and gave the eager speedup an interval of [0, 1.34]."""
    most_ms = SAMPLE_SLACK * segment_s * 1e3 + SAMPLE_SLACK_MS
    for x in samples_ms:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise protocol.ProtocolError("malformed timing samples (not numbers)")
        if not math.isfinite(x) or x <= 0:
            raise protocol.ProtocolError(f"a timing sample of {x!r} ms (every call takes a finite, positive time)")
        if x > most_ms:
            raise protocol.ProtocolError(f"a timing sample of {float(x):.6g} ms in a segment the server's clock "
                                         f"saw last {segment_s * 1e3:.3f} ms")


def empty_call_claim(message: dict[str, Any]) -> EmptyCallClaim | None:
    """What the candidate's timer took off every call (its empty call's event pair and host
    overhead, in ms), as it claims: shown for diagnosis in `timed_loop`, believed for nothing.
    None unless both are finite numbers from 0 to 1000."""
    event = message["event_ms"][0] if len(message["event_ms"]) == 1 else None
    host = message["overhead_ms"]
    for value in (event, host):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1e3:
            return None
    return {"event": round(float(event), 6), "host": round(float(host), 6)}


def loop_plan(config: EvalConfig, estimate_ms: float, budget: int, output_bytes: int) -> dict[str, int]:
    """The timed loop's shape from the reference's time per call: `total` measured calls (at
    least target_ms of work), `warmup` calls, and with the defences on `keep` outputs kept per
    segment of `calls` calls, `segments` of them, within the harness's memory `budget`;
    `budget_bytes` is what is left of it for fresh input sets."""
    total = int(min(max(-(-config.target_ms // estimate_ms), config.min_reps), config.max_reps))
    warmup = int(min(max(-(-config.warmup_ms // estimate_ms), 2), 50))
    keep, segments, calls = 0, 1, total
    if config.defences:
        # Every measured call keeps its output until the server has had the secret subset
        # verified. Memory holds `keep` outputs (two thirds of the harness's budget), so the
        # loop runs in segments of `keep` calls: after each segment the outputs the server
        # chose in secret (maybe none) are compared with the candidate stopped, and the slots
        # are reused. Any call can be checked, and the loop stays as long as timing needs.
        keep = int(max(1, min(total, MAX_KEPT_CALLS, (2 * budget // 3) // output_bytes)))
        keep = min(keep, -(-total // min(MIN_SEGMENTS, total)))
        segments = min(-(-total // keep), MAX_SEGMENTS)
        calls = keep
    return {"total": total, "warmup": warmup, "keep": keep, "segments": segments, "calls": calls,
            "budget_bytes": int(max(budget - keep * output_bytes, 0))}


class TimedLoop:
    """The candidate's timed loop, with its calibration (server/calibration.py)."""

    def __init__(self, job: TimedJob):
        self.job = job
        self.calibration = Calibration(job)
        # set where the loop's deadline was cut to the slot's limit beside other jobs (run() says so)
        self.slot_limited: float | None = None
        self.plan_shared = False  # the loop's plan came from another server of the host (loop_plan)

    def run_segment(self, seed: int, deadline: float) -> tuple[dict[str, Any], float, float]:
        """One segment's order and the candidate's report: (report, sent, t0). `sent`, read before
        the order leaves, bounds the candidate's calls from below (they start once "go" has
        arrived): the sample check measures from it. `t0`, read after the send, clocks the
        segment. The wakee may take the server's core the moment "go" arrives (a busy host: 2
        cores in CI), so the server can resume milliseconds later; checked from t0, an honest
        call can read longer than its segment (docs/concepts/timing.md, "Measurements behind the
        code")."""
        sent = time.perf_counter()
        self.job.channels.cand_send("go", seed=seed)
        t0 = time.perf_counter()
        return self.job.channels.cand_recv({"timing"}, deadline), sent, t0

    def timed_loop(self, deadline: float) -> bool:
        """The calibration and the candidate's loop, holding the device's timing slot: every
        other job stopped, the device idle before each (server/gate.py)."""
        job = self.job
        with job.gate.hold(self.job, job.idle_probe if job.fingerprint.get("cuda") else None,
                           job.concurrency) as hold:
            job.hold = hold
            try:
                return self._timed_loop(deadline)
            finally:
                job.hold = None
                if hold.busy:
                    job.flag(verdict.flag(
                        "device-busy", "another process kept the device busy through the timed loop (the harness "
                        f"waited {job.gate.idle_wait_s:.0f} s for it to go idle): the times are not the "
                        "candidate's alone and do not count", "review"))
                elif job.concurrency.get("bandwidth_busy"):
                    # Not the candidate's doing, and maybe the device's own state (gate.Bandwidth):
                    # said, never held against it.
                    job.flag(verdict.flag(
                        "bandwidth-busy", "the device's memory bandwidth still read below its recent best after "
                        "the harness's wait before the timed loop (memory being cleared by the driver, or "
                        "copies queued by another process): the times may read slow", "info"))

    def loop_plan(self, estimate_ms: float, settings: dict[str, Any]) -> tuple[dict[str, int], bool]:
        """The timed loop's shape (module loop_plan) and whether it was reused. On a GPU a later job
        of the same problem and settings in this server runs the loop the first one ran (its
        length comes from the reference's eager time, which varies by a few percent between
        jobs): the same order, so the calibration measured for it is reused, not run again
        (docs/concepts/concurrency.md, "The loop's plan and calibration reused"). Not where less
        memory is free than the plan needs, and never on the CPU, where the loop is sized by this
        candidate's own calls (the interpreter)."""
        job = self.job
        budget = self.harness_budget()
        output_bytes = max(int(job.ready.get("output_bytes", 0)), 1)
        if not job.fingerprint.get("cuda"):
            return loop_plan(job.config, estimate_ms, budget, output_bytes), False

        def fits(plan: dict[str, int] | None) -> bool:  # else less memory is free than when it was made
            return plan is not None and plan["keep"] * output_bytes + plan["budget_bytes"] <= budget

        # One key for this server's plans and the host's (calibration_store.py, "the plan is shared
        # too"): another server that made this problem's plan first runs the same loop, so reads
        # the same calibration.
        key = calibration_store.plan_key(job.fingerprint, problem_source=job.problem_source, settings_=settings,
                                         output_bytes=output_bytes)
        plan = job.gate.plans.get(key)
        if fits(plan):
            return plan, True
        store = job.gate.calibration_store
        shared, own = store.get_plan(key), None
        if shared is None:  # the first plan written for the key is every server's: ours unless another came first
            own = loop_plan(job.config, estimate_ms, budget, output_bytes)
            shared = store.put_plan(key, own)
        if fits(shared) and shared != own:
            self.plan_shared = True
            job.gate.plans[key] = shared
            return shared, True
        own = own if own is not None else loop_plan(job.config, estimate_ms, budget, output_bytes)
        job.gate.plans.setdefault(key, own)
        return own, False

    def _timed_loop(self, deadline: float) -> bool:
        """The candidate's loop, step by step: its plan and order, the calibration, the warm-up,
        the secret choice of the verified calls, each segment clocked and verified, then the
        server's time (recalibrated at most once) recorded with its flags. True to go on."""
        job = self.job
        estimate = self._loop_estimate()
        settings = {k: v for k, v in job.config.to_dict().items() if k not in LOOP_NEUTRAL}
        plan, plan_reused = self.loop_plan(estimate, settings)
        total, warmup, keep, segments, calls = (plan[k] for k in ("total", "warmup", "keep", "segments", "calls"))
        deadline = self._slot_deadline(deadline, estimate=estimate, total=total, warmup=warmup, segments=segments)
        order = self._loop_order(plan)
        measured = calls * segments
        # The loop's own cost, measured in the trusted process on this clock, segment by segment
        # exactly as the candidate's loop; then the candidate's loop. Each warms up first,
        # unclocked; the clock runs from each segment's `go` (which reveals its calls' seed) to its
        # report, so nothing of the measured calls can happen outside it.
        calibration_key = calibration_store.key(job.fingerprint, problem_source=job.problem_source,
                                                settings_=settings, order=order.fields())
        calibration_s, reused = self.calibration.first(order, segments=segments, deadline=deadline,
                                                       key=calibration_key)
        ipc_kept = self._warm_candidate(order, keep=keep, deadline=deadline)
        timed_seed = draws.check_seed(job.base_seed, "timed loop") + job.rng.getrandbits(30)
        # The verified calls, drawn now in secret over the whole loop (the last call always); how
        # many varies, so the answers' timing seen so far says nothing of those to come (draws.py).
        chosen = draws.verified_calls(job.rng, measured, TIMED_CHECKS) if keep else set()
        job.facts.timed_loop = {"calls": measured, "segments": segments, "warmup_calls": warmup, "kept": keep,
                                    "verified": len(chosen), "server_loop_s": 0.0, "calibration_s": calibration_s,
                                    "calibration_reused": reused, "calibration_shared": self.calibration.shared,
                                    "plan_reused": plan_reused, "plan_shared": self.plan_shared}
        samples: list[Any] = []
        segment_s: list[float] = []  # the server's clock around each segment
        loop_s = 0.0
        ok, meaningful = True, True
        # The SM clock over the candidate's loop, read here (NVML, a thread) where it cannot touch it.
        sampler = self.clock_sampler(measured * max(float(job.ready.get("estimate_ms", 1.0)), 0.005) / 1e3)
        clocks = None
        if sampler is not None:
            sampler.start()
        try:
            for segment in range(segments):
                ok, meaningful, seconds = self._timed_segment(
                    segment, calls=calls, keep=keep, segments=segments, timed_seed=timed_seed, chosen=chosen,
                    ipc_kept=ipc_kept, samples=samples, segment_s=segment_s, meaningful=meaningful, deadline=deadline)
                loop_s += seconds
                if not ok:
                    break
        finally:
            clocks = sampler.stop() if sampler is not None else None
        job.facts.timed_loop["server_loop_s"] = loop_s
        add_seconds(job.concurrency, "slot_loop_s", loop_s)
        if not ok:
            return False
        if not samples or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in samples):
            # none at all: trusted_time could not decide without a calibration (--no-defences on
            # the CPU), and its ValueError was a harness error
            raise protocol.ProtocolError("malformed timing samples (none, or not numbers)")
        calibration = self.calibration
        if calibration.deferred:  # another server was measuring it: read now (or measured, where none came)
            calibration_s, reused = calibration.after_loop(order, segments=segments, deadline=deadline,
                                                           key=calibration_key)
            job.facts.timed_loop.update(calibration_s=calibration_s, calibration_reused=reused,
                                        calibration_shared=calibration.shared)
        if calibration_s is not None and calibration.recalibration_wanted(calibration_key, samples, measured, loop_s,
                                                                          calibration_s):
            calibration_s = calibration.recalibrate(order, segments=segments, deadline=deadline, first_s=calibration_s,
                                                    key=calibration_key)
        self._record_timing(samples, measured=measured, loop_s=loop_s, calibration_s=calibration_s,
                            meaningful=meaningful, segment_s=segment_s, calls=calls, clocks=clocks)
        return ok

    def _loop_estimate(self) -> float:
        """The time per call (ms) that sizes the timed loop."""
        job = self.job
        if job.fingerprint.get("cuda"):
            # The reference's eager time (trusted) sizes the loop on a GPU; a candidate slower than
            # eager gets a longer loop, never a shorter one.
            return max(float(job.ready.get("estimate_ms", 1.0)), 0.005)
        # the interpreter is far slower than eager: the server's clock on the checks
        return max(min(job.call_latency_ms or [1.0]), 1e-3)

    def _slot_deadline(self, deadline: float, *, estimate: float, total: int, warmup: int, segments: int) -> float:
        """The loop's deadline: beside other jobs on a GPU, no later than the slot's limit."""
        job = self.job
        if job.fingerprint.get("cuda") and job.gate.active() > 1:
            # Beside other jobs, the slot is held no longer than this loop plausibly needs: its two
            # loops (calibration, candidate) at 50x the reference's time per call, SLOT_SEGMENT_S
            # per segment for its comparisons, and at least SLOT_MIN_S. A candidate whose own
            # queued work makes every call wait (a spinner thread: each synchronize waits for its
            # backlog) times out here, not at the stage limit with every other job waiting.
            slot_limit = max(SLOT_MIN_S, 2 * 50 * (total + warmup) * estimate / 1e3 + SLOT_SEGMENT_S * segments)
            if job.clock() + slot_limit < deadline:
                deadline = job.clock() + slot_limit
                self.slot_limited = slot_limit
        return deadline

    def _loop_order(self, plan: dict[str, int]) -> LoopOrder:
        """The order both loops run (calibration and candidate), from the plan."""
        job = self.job
        l2 = job.fingerprint.get("l2_bytes")
        # Without CUDA IPC the kept outputs come to the server as bytes after each segment's
        # report, and the server's clock runs until they are all here (outputs computed after the
        # report are clocked): the calibration sends as many bytes the same way.
        payloads = bool(plan["keep"]) and not (job.fingerprint.get("cuda") and (job.request.get("options") or {})
                                               .get("ipc", True))
        return LoopOrder(calls=plan["calls"], warmup_calls=plan["warmup"], keep=plan["keep"],
                         segments=plan["segments"], budget_bytes=plan["budget_bytes"],
                         l2_bytes=int(l2) if l2 else None, payloads=payloads)

    def _warm_candidate(self, order: LoopOrder, *, keep: int, deadline: float) -> list[Any]:
        """The candidate's order and its unclocked warm-up; the kept slots' IPC handles it sent
        (on a GPU, before the clock ran; else none)."""
        job = self.job
        if job.hold is not None:
            job.hold.wait_idle()  # the calibration's own work, and anything a neighbour left, drained
        warming = time.monotonic()
        job.channels.cand_send("time", seed=job.rng.getrandbits(40), **order.fields())
        warmed = job.channels.cand_recv({"warmed"}, deadline)
        add_seconds(job.concurrency, "slot_warmup_s", time.monotonic() - warming)
        ipc_kept = warmed["kept"]  # on a GPU: the kept slots' IPC handles, sent before the clock ran
        if len(ipc_kept) not in (0, keep):
            raise protocol.ProtocolError("the timed loop did not run as ordered")
        return ipc_kept

    def _timed_segment(self, segment: int, *, calls: int, keep: int, segments: int, timed_seed: int, chosen: set[int],
                       ipc_kept: list[Any], samples: list[Any], segment_s: list[float], meaningful: bool,
                       deadline: float) -> tuple[bool, bool, float]:
        """One segment: run and clocked (its samples appended to `samples`, the server's time to
        `segment_s`), its secretly chosen calls verified with the candidate stopped, and the
        candidate told. (passed, meaningful so far, the server's seconds around it)."""
        job = self.job
        first = segment * calls
        message, sent, t0 = self.run_segment(timed_seed + first, deadline)
        kept = ipc_kept or message["kept"]
        if message["calls"] != calls or len(kept) != keep or not isinstance(message["samples_ms"], list) \
                or len(samples) + len(message["samples_ms"]) > 100_000:
            raise protocol.ProtocolError("the timed loop did not run as ordered")
        samples += message["samples_ms"]
        if segment == 0:
            job.facts.timed_loop["empty_call_ms"] = empty_call_claim(message)
        meaningful = meaningful and bool(message["meaningful"])
        kept_payloads = []
        for entry in kept:
            if not isinstance(entry, dict) or not isinstance(entry.get("outputs"), list) \
                    or not isinstance(entry.get("index"), int):
                raise protocol.ProtocolError("malformed kept output")
            kept_payloads.append([] if ipc_kept else job.channels.relay_payloads(entry["outputs"], deadline,
                                                                                 job.channels.payload_limit()))
        # The clock stops once the segment's outputs have arrived as bytes (above, without
        # CUDA IPC), and the candidate is stopped at once: no host work of its own runs
        # after its report, nor while its kept outputs are read (it stays stopped until the
        # comparisons are done). Not clocked on a GPU: device work it queued before the
        # report that finishes after it. Clocking until the trusted reference's probe reads
        # the device idle was tried: the probe reads busy for milliseconds after every segment,
        # even of honest, synchronised tiny kernels, which charges them many times their time
        # (docs/concepts/timing.md, "Measurements behind the code").
        t1 = time.perf_counter()
        stopped = job.stop_candidate(True)
        segment_s.append(t1 - t0)
        with job.failures.handling_candidate("timing samples"):
            check_samples(message["samples_ms"], t1 - sent)
        comparing = time.monotonic()
        ok = self._verify_kept(segment, first=first, calls=calls, segments=segments, timed_seed=timed_seed,
                               chosen=chosen, kept=kept, kept_payloads=kept_payloads, ipc_kept=ipc_kept,
                               deadline=deadline)
        if stopped:
            job.stop_candidate(False)
        add_seconds(job.concurrency, "slot_compare_s", time.monotonic() - comparing)
        last = segment == segments - 1
        job.channels.cand_send("check_reply", decided=not ok, passed=ok, stop=not ok or last)
        return ok, meaningful, t1 - t0

    def _verify_kept(self, segment: int, *, first: int, calls: int, segments: int, timed_seed: int, chosen: set[int],
                     kept: list[Any], kept_payloads: list[Any], ipc_kept: list[Any], deadline: float) -> bool:
        """The reference compares the calls of this segment chosen in secret (maybe none), from
        their kept outputs; False at the first that fails."""
        here = sorted(i for i in chosen if first <= i < first + calls)
        for index in here:
            slot = index - first
            entry = kept[slot]
            if not ipc_kept and entry["index"] != slot:
                raise protocol.ProtocolError("kept outputs out of order")
            check = {"name": f"timed call {index}", "kind": "main", "seed": timed_seed + index, "stop": True}
            self.job.planned.append(check["name"])
            # The reference keeps its cached memory until the loop's last segment: memory
            # it gave back to the driver between segments was cleared in the background
            # while the candidate's next calls ran (gate.Bandwidth).
            record = self.job.checks.compare(check, len(entry["outputs"]), entry["outputs"], [], kept_payloads[slot],
                                             deadline, keep_cache=segment < segments - 1)
            if not record.passed:
                return False
        return True

    def _record_timing(self, samples: list[Any], *, measured: int, loop_s: float, calibration_s: float | None,
                       meaningful: bool, segment_s: list[float], calls: int, clocks: list[float] | None) -> None:
        """The server's decision on the candidate's time (verdict.trusted_time), recorded with its
        flags, the timer traps' and the roofline's."""
        job = self.job
        config = job.config
        decision = verdict.trusted_time(samples, measured, loop_s, calibration_s,
                                        meaningful and bool(job.fingerprint.get("cuda")),
                                        segment_s=segment_s, calls_per_segment=calls)
        timing: TimingRecord = {**decision.timing, "samples_ms": [float(x) for x in samples][:5000],
                                "source": decision.source, "clocks_mhz": clocks or [],
                                "server_segments_ms": decision.segments_ms}
        job.facts.timings["candidate"] = timing
        job.facts.timed_loop.update(server_ms_per_call=decision.server_ms,
                                        claimed_mean_ms=decision.claimed_mean_ms, source=decision.source)
        for item in decision.flags:
            job.flag(item)
        for item in self.timer_flags(clocks, timing["samples_ms"]):
            job.flag(item)
        if config.defences:  # on the CPU this notes that the check does not apply
            roof = verdict.check_roofline(job.fingerprint, job.ready, float(timing["median_ms"]),
                                          config.roofline_margin)
            if roof:
                job.flag(roof)

    def clock_sampler(self, expected_s: float) -> Any:
        """A ClockSampler for the device (child/sm_clocks.py), or None: no GPU, no NVML in the probe,
        or an NVML whose start-up is too slow to pay for on every evaluation."""
        job = self.job
        nvml = job.fingerprint.get("nvml") or {}
        if not job.fingerprint.get("cuda") or not nvml.get("available") or \
                float(nvml.get("init_ms") or 1e9) > NVML_INIT_MAX_MS:
            return None
        from kernelagent.harness.child.sm_clocks import ClockSampler

        try:
            return ClockSampler.for_device(job.fingerprint.get("uuid"), job.fingerprint.get("pci_bus_id"), expected_s)
        except Exception:  # noqa: BLE001 - no clocks rather than no evaluation
            return None

    def timer_flags(self, clocks: list[float] | None, samples_ms: list[float]) -> list[dict[str, str]]:
        """The timer traps that concern the candidate's loop: the clock dropped over it, or the
        device probe found that the L2 flush does not evict or that persisting L2 cannot be reset."""
        job = self.job
        from kernelagent.harness.result import throttling_flag

        flags = []
        throttled = throttling_flag("candidate's", clocks, samples_ms)
        if throttled is not None:
            flags.append(verdict.flag(throttled.kind, throttled.message))
        if not job.fingerprint.get("cuda"):
            return flags
        flush = job.fingerprint.get("l2_flush") or {}
        if flush.get("evicts") is False and job.config.flush_l2:
            flags.append(verdict.flag(
                "l2-flush", f"the L2 flush did not evict in the device probe (a read after the flush took "
                f"{flush.get('cold_ms')} ms, a second read {flush.get('warm_ms')} ms; rule: {flush.get('rule')}): "
                "the times are partly warm-L2"))
        reset = job.fingerprint.get("l2_reset")
        if reset and reset != "ok":
            flags.append(verdict.flag("l2-reset", "persisting L2 lines were not reset before each timed call: "
                                      + str(reset)))
        return flags

    def harness_budget(self) -> int:
        """Device bytes the harness itself may hold in one process beyond the problem's own
        inputs, outputs and parameters (kept outputs, fresh input sets made ahead): 1.5 times the
        problem's I/O bytes (at least memory_plan.HARNESS_FLOOR), within 30% of the free memory. With one set of
        inputs and outputs in use, a process then stays within about 2.5x the problem's bytes
        (the memory plan, issue 12). On the CPU a fixed 256 MiB."""
        job = self.job
        if not job.fingerprint.get("cuda"):
            # The knob lets the CPU tests drive the segmented loop with small problems.
            return setting("KERNELAGENT_CPU_KEEP_BYTES")
        io = int(job.ready.get("input_bytes", 0)) + int(job.ready.get("output_bytes", 0))
        free = int(job.ready.get("memory", {}).get("free_bytes", 0))
        return memory_plan.harness_bytes(io, free)

