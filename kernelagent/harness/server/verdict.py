"""The verdict of one evaluation, as pure functions over trusted check records.

Runs in the harness server. Its inputs are:
- verdicts of the checks, each computed by the trusted reference process (`CheckRecord`);
- the plan: the names of the checks the server asked for;
- what the server itself observed (its own clock over the timed loop, process exits);
- claims from the candidate's process (in-process timings, evidence flags), which can only
  make a verdict worse, never better.

`correct` needs every planned check to have been compared in the reference process and to have
passed. Nothing here does I/O, so tests/test_verdict.py runs the whole table in milliseconds.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from kernelagent.harness.result import SEVERITY, Status
from kernelagent.harness.server.record_types import TimingQuantiles
from kernelagent.harness.stats import quantile

# Timed loop checks (trusted_time): the server's per-call time may exceed the mean that the
# candidate's process claims by this share of the server's time, plus an absolute allowance for
# the noise of subtracting the calibrated loop overhead (see `clock_slack_ms`).
CLOCK_REL_SLACK = 0.10
# Beyond this many slacks, with the claim under half the server's time, the in-process clock was
# not just noisy: rejected as tampering.
CLOCK_GROSS_FACTOR = 3.0


@dataclass
class CheckRecord:
    """A comparison made by the reference process."""

    name: str
    kind: str
    seed: int
    passed: bool
    message: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    rel_l2_err: float | None = None
    rejected: str | None = None  # e.g. "input-mutation", "bad-payload"
    harness_error: bool = False
    skipped: bool = False
    precision: str = ""  # which relative L2 rule judged (child/compare.py), with its numbers

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> "CheckRecord":
        return cls(**{f.name: message[f.name] for f in dataclasses.fields(cls)})


@dataclass
class Outcome:
    status: str | None = None
    reason: str = ""
    stage: str | None = None
    flags: list[dict[str, str]] = field(default_factory=list)

    @property
    def correct(self) -> bool:
        return self.status == Status.CORRECT


def flag(kind: str, message: str, severity: str | None = None) -> dict[str, str]:
    return {"kind": kind, "message": message, "severity": severity or SEVERITY.get(kind, "info")}


MAX_COUNT_CLAIM = 10**9


def count_claim(value: object) -> int:
    """A count a child process reported (allocator retries, say): an int from 0 to
    MAX_COUNT_CLAIM, else 0 (a bool, a float, a negative or absurd number says nothing)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT_CLAIM:
        return 0
    return value


def trusted_flags(claimed: list[Any]) -> list[dict[str, str]]:
    """Flags reported by the candidate's process, with severities from our table: a claimed
    severity is ignored (a candidate cannot downgrade its own evidence), and an unknown kind is
    only information. Bounded, so a flood of claims cannot bloat the result."""
    out = []
    for item in claimed[:50]:
        if not isinstance(item, dict):
            continue
        kind = str(item.get("kind", "?"))[:60]
        out.append(flag(kind, str(item.get("message", ""))[:2000], SEVERITY.get(kind, "info")))
    return out


def trusted_kernel_rows(claimed: object) -> list[dict[str, Any]]:
    """The candidate's profiler rows (child/kernel_profile.profile_kernels), validated by type:
    only the known fields, a name as bounded text, finite non-negative times and counts, a share
    in [0, 1], `own` a bool and `kind` one of ours. Anything else in a row, or a row that is not
    a dict, is dropped: these rows are the candidate's word, printed and divided by later."""
    rows: list[dict[str, Any]] = []
    for item in claimed[:50] if isinstance(claimed, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            continue
        row: dict[str, Any] = {"name": item["name"][:300]}
        for key, top in (("total_ms", 1e9), ("share", 1.0), ("calls", 1e9)):
            value = item.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
                    and 0 <= value <= top:
                row[key] = int(value) if key == "calls" else float(value)
        if isinstance(item.get("own"), bool):
            row["own"] = item["own"]
        if item.get("kind") in ("device", "cpu-op"):
            row["kind"] = item["kind"]
        rows.append(row)
    return rows


def conclude_checks(planned: list[str], checks: dict[str, CheckRecord], compile_only: bool = False,
                    compiled: bool = False, derived: dict[str, tuple[str, str]] | None = None) -> Outcome:
    """The verdict from the checks alone, once the candidate's process has finished normally.
    derived: for derived check sets (harness/derive/), kind ("extra:<j>") -> (the set's
    changed dims, the main set's values of them), in words, for the flag's message."""
    if compile_only:
        if compiled:
            return Outcome(Status.COMPILED, "loaded and ran its first call")
        return Outcome(Status.HARNESS_ERROR, "the candidate stopped without reporting its first call")
    if not planned:
        # Never "correct by default": an evaluation that planned no checks proves nothing.
        return Outcome(Status.HARNESS_ERROR, "no correctness check was planned", "correctness")
    main_failures: list[CheckRecord] = []
    extra_failures: list[CheckRecord] = []
    missing = [name for name in planned if name not in checks]
    for name in planned:
        check = checks.get(name)
        if check is not None and not check.passed:
            (extra_failures if check.kind.startswith("extra:") else main_failures).append(check)
    # A harness error or a rejection on any set, an extra (other-shape) one too, outranks what the
    # comparisons say: a reference that ran out of memory on a derived set beside other jobs is not
    # the candidate's shape specialisation (the path found to an honest Sigmoid flagged so beside
    # other jobs on an H100; the job is re-run alone, conclude_concurrency), and a malformed payload
    # or a mutated input on an extra set is as much a breach as on the main one.
    harness = [c for c in main_failures + extra_failures if c.harness_error]
    if harness:
        first = harness[0]
        where = f" (extra input set '{first.name}')" if first.kind.startswith("extra:") else ""
        return Outcome(Status.HARNESS_ERROR, first.message + where, "correctness")
    rejected = [c for c in main_failures + extra_failures if c.rejected]
    if rejected:
        first = rejected[0]
        return Outcome(Status.REJECTED, f"[{first.rejected}] {first.name}: {first.message}", "correctness",
                       [flag(first.rejected or "rejected", first.message, "reject")])
    if main_failures:
        first = main_failures[0]
        post = first.name.startswith(("post-timing", "timed call"))
        stage = "post-check" if post else "correctness"
        hint = (" (it passed before timing: do the timed calls compute something else, or cache outputs "
                "between calls?)" if post else "")
        flags = []
        alt = [c for c in main_failures if c.kind == "alt"]
        if alt and first.kind == "alt":
            hint = (" (it passes on the problem's own inputs but not where lines of signed normal values are "
                    "mixed into them: does the kernel rely on the input distribution?)")
            flags.append(flag("input-distribution", f"{first.name}: {first.message}"[:600] + hint, "info"))
        elif first.kind == "near-one":
            hint = (" (it passes on the problem's own inputs but not where lines of values near one are mixed "
                    "into them, along which every element of a product or scan stays significant: does the "
                    "kernel compute every output element?)")
            flags.append(flag("input-distribution", f"{first.name}: {first.message}"[:600] + hint, "info"))
        return Outcome(Status.INCORRECT, f"{first.name}: {first.message}{hint}", stage, flags)
    if missing:
        return Outcome(Status.HARNESS_ERROR, f"check '{missing[0]}' was planned but never compared", "correctness")
    outcome = Outcome(Status.CORRECT, "")
    if extra_failures:
        first = extra_failures[0]
        derived = derived or {}
        if first.kind in derived:
            dims, main = derived[first.kind]
            others = [f"at {derived[c.kind][0]}" if c.kind in derived else c.name for c in extra_failures[1:]]
            message = (f"correct at the main shape ({main}) but fails at {dims}"
                       + (f" (and {', '.join(others)})" if others else "")
                       + f": {first.message.strip()[:1500]}. The kernel must not assume the main shape: read "
                         "every size from the inputs' shapes, size the grid from them and mask the ragged tails")
        else:
            names = ", ".join(c.name for c in extra_failures)
            message = f"passes the main shape but fails {names}: {first.message}"
        outcome.flags.append(flag("shape-specialisation", message, "review"))
    return outcome


# --------------------------------------------------------------------------------------
# Timing: the candidate's in-process samples against the server's own clock
# --------------------------------------------------------------------------------------

# Jitter a clocked loop may have that its calibration did not (a page fault, the scheduler, one
# slow message): allowed once per loop, not per call. Both loops warm up unclocked first, so
# one-time allocation costs fall outside the clock. A candidate can hide at most this much of its
# work from the server's clock in a whole loop.
CLOCK_ALLOWANCE_MS = 2.0
CPU_CLOCK_REL_SLACK = 0.4  # the CPU's floor on the slack, as a share of the server's time (a busy 2-core runner)
# ...and an absolute one per loop: a loop of one or two interpreted calls is a few ms of server
# time, and one scheduler slice on a busy 2-core runner took 3 ms more than the claim (CI flakes
# on honest HardTanh, SELU and log_softmax solutions). CPU times are not meaningful as speeds;
# a claim short by more than this is still flagged.
CPU_CLOCK_ALLOWANCE_MS = 50.0
CPU_GROSS_SHARE = 0.2  # on the CPU, a claim under this share of the server's time is tampering


def clock_slack_ms(server_total_ms: float, calibration_ms: float) -> float:
    """How far the server's time for a whole timed loop (its calibration subtracted) may exceed
    the total the candidate's process claims before the two disagree: 10% of the server's time,
    a quarter of the calibration that was subtracted (two loops' overheads are measured, not
    known, and their noise scales with them), and the one-time allowance."""
    return CLOCK_REL_SLACK * server_total_ms + 0.5 * max(calibration_ms, 0.0) + CLOCK_ALLOWANCE_MS


def needs_recalibration(samples_ms: list[Any], calls: int, loop_s: float, calibration_s: float) -> bool:
    """Does the candidate's claimed total fall short of the server's time (its calibration
    subtracted) by more than the relative slack? Then the calibration is measured again and the
    smaller one is used: a calibration slowed by noise must not hide a forged clock."""
    clean = [float(x) for x in samples_ms if isinstance(x, (int, float)) and math.isfinite(x) and x >= 0]
    if not clean or calls <= 0:
        return False
    server_total_ms = max((loop_s - calibration_s) * 1e3, 0.0)
    claimed_total_ms = sum(clean) / len(clean) * calls
    return server_total_ms - claimed_total_ms > CLOCK_REL_SLACK * server_total_ms


@dataclass
class TimeDecision:
    timing: TimingQuantiles  # the first fields of result.Timing
    source: str  # "in-process" or "server"
    server_ms: float | None
    claimed_mean_ms: float | None
    flags: list[dict[str, str]] = field(default_factory=list)
    # The server's own time per call in each segment (its clock, the calibration's share taken
    # off): the distribution the candidate's samples are checked against, and that the speedup
    # interval is widened to (caller/evaluator.py).
    segments_ms: list[float] = field(default_factory=list)


# The claimed median may sit this far under what the server's segments allow before it
# disagrees (a share): per-call times skew right, more than the averages of segments do.
MEDIAN_TOLERANCE = 0.3
MIN_SERVER_SEGMENTS = 4  # fewer segments give no distribution to check a median against
# More than this share of segments at or under their calibration share: the segments are the
# loop's noise, not the kernel's times (segments_settled).
NOISY_SEGMENT_SHARE = 0.25
# A claimed median under this share of the floor is held for review (clock-mismatch); between it
# and the floor the server's numbers replace the claim with an info note (clock-median).
GROSS_MEDIAN_SHARE = 0.5


def segment_times(segment_s: list[float], calls_per_segment: int, calibration_s: float | None) -> list[float]:
    """The server's time per call in each segment, in ms: the segment's clock less its share of
    the calibration (the empty loop's cost, measured the same way), over its calls."""
    if not segment_s or calls_per_segment <= 0 or calibration_s is None:
        return []
    share_ms = calibration_s * 1e3 / len(segment_s)
    return [max(s * 1e3 - share_ms, 0.0) / calls_per_segment for s in segment_s]


def scaled_segments(segments_ms: list[float], mean_ms: float) -> list[float]:
    """The server's per-segment times scaled so that their mean is `mean_ms` (the mean the whole
    loop's clock verified): their spread and shape are the server's, while a per-segment cost
    the calibration does not remove exactly (a few hundred us a segment on an H100) is no bias."""
    clean = [m for m in segments_ms if m > 0]
    if not clean or mean_ms <= 0:
        return []
    factor = mean_ms / (sum(clean) / len(clean))
    # A segment at or under its share of the calibration says nothing of the kernel's time (the
    # loop's own noise exceeded it there): kept as a zero, it read as a call of 0 ms.
    return [m * factor for m in clean]


def segments_settled(raw_ms: list[float]) -> bool:
    """Do the server's per-segment times describe the kernel rather than the loop's own noise? At
    least MIN_SERVER_SEGMENTS of them, and no more than NOISY_SEGMENT_SHARE at or under their
    share of the calibration. A tiny kernel under a launch cover (a 7 us softmax whose calls
    cost the loop 0.65 ms each) has segments within the calibration's noise: their distribution
    is then no distribution of the kernel, and the verified mean is reported instead."""
    clean = [m for m in raw_ms if m > 0]
    return len(clean) >= MIN_SERVER_SEGMENTS and len(raw_ms) - len(clean) <= NOISY_SEGMENT_SHARE * len(raw_ms)


def median_floor_ms(segments_ms: list[float], mean_ms: float) -> float | None:
    """The least median per call the server's segments allow for a loop whose verified mean per
    call is `mean_ms`: the same ratio of median to mean as the server's own segments, less
    MEDIAN_TOLERANCE. None with fewer than MIN_SERVER_SEGMENTS segments."""
    clean = sorted(m for m in segments_ms if m > 0)
    if len(clean) < MIN_SERVER_SEGMENTS or mean_ms <= 0:
        return None
    return (1 - MEDIAN_TOLERANCE) * mean_ms * quantile(clean, 0.5) / (sum(clean) / len(clean))


def trusted_time(samples_ms: list[float], calls: int, loop_s: float, calibration_s: float | None,
                 meaningful: bool, segment_s: list[float] | None = None,
                 calls_per_segment: int = 0) -> TimeDecision:
    """The candidate's time, from claims checked against the server's clock.

    samples_ms: per-call times the candidate's process claims for its measured calls.
    calls: how many calls (warm-up included) the server asked the loop to make.
    loop_s: the server's own clock around the candidate's whole timed loop.
    calibration_s: the server's clock around the reference process running the same loop with
        an empty model (fresh inputs, L2 flush, synchronisation, output copy): the loop's overhead.
    segment_s, calls_per_segment: the server's clock around each segment of the loop.

    The candidate's samples are believed only within what the server measured itself: their mean
    against the server's total, their median against the server's per-segment times
    (median_floor_ms). Outside the calibrated slack the claim is flagged on every device (review:
    no win), and the server's own numbers are reported instead; grossly outside, it is tampering.
    """
    raw = segment_times(list(segment_s or []), calls_per_segment, calibration_s)
    decision = _trusted_time(samples_ms, calls, loop_s, calibration_s, meaningful,
                             least_segment_ms=min(raw) if raw else None)
    # the verified mean per call: the claim's where it agreed with the server's total, never above it
    if decision.source == "in-process" and decision.claimed_mean_ms is not None:
        mean_ms = min(decision.claimed_mean_ms, decision.server_ms or decision.claimed_mean_ms)
    else:
        mean_ms = decision.server_ms or 0.0
    decision.segments_ms = scaled_segments(raw, mean_ms)
    settled = segments_settled(raw)
    if decision.source == "server" and settled:
        decision.timing = _segments(decision.segments_ms, meaningful)  # a distribution, not a point
    floor = median_floor_ms(raw, mean_ms)
    if floor is None and decision.source == "in-process" and mean_ms > 0:
        # Too few segments for the server's own distribution (a short loop, the CPU's above all):
        # the claimed median still may not sit far below the verified mean. Unchecked, a median at
        # 0.64x the mean was reported as the candidate's own time on the CPU.
        floor = (1 - MEDIAN_TOLERANCE) * mean_ms
    if decision.source == "in-process" and floor is not None and decision.timing["median_ms"] < floor:
        claimed = decision.timing["median_ms"]
        # The claim is not believed either way: the server's own times are reported. Only a gross
        # gap is held for review. An honest loop whose slow calls fall in every segment (an H100:
        # glue ops, median 0.0385 ms against a floor of 0.0428 ms) has a per-call median well under
        # its segments' and must not lose its win for it; a forged one gains nothing from the claim.
        gross = claimed < GROSS_MEDIAN_SHARE * floor
        decision.flags.append(flag(
            "clock-mismatch" if gross else "clock-median",
            f"the candidate's process reported a median of {claimed:.4f} ms per call, but the "
            f"server's clock over {len(raw)} segments allows no less than {floor:.4f} ms for a "
            f"mean of {mean_ms:.4f} ms per call: the server's times are reported"))
        decision.timing = _segments(decision.segments_ms, meaningful) if settled else \
            _point(mean_ms, calls, meaningful, "server clock (the verified mean)")
        decision.source = "server"
    return decision


def _segments(segments_ms: list[float], meaningful: bool) -> TimingQuantiles:
    """Quantiles of the server's own per-segment times per call."""
    return _quantiles(sorted(segments_ms), meaningful, "server clock, per segment")


def _quantiles(ordered: list[float], meaningful: bool, note: str) -> TimingQuantiles:
    """The fields of result.Timing for sorted per-call times."""
    return {"median_ms": quantile(ordered, 0.5), "q1_ms": quantile(ordered, 0.25), "q3_ms": quantile(ordered, 0.75),
            "min_ms": ordered[0], "reps": len(ordered), "meaningful": meaningful, "note": note}


def _trusted_time(samples_ms: list[float], calls: int, loop_s: float, calibration_s: float | None,
                  meaningful: bool, least_segment_ms: float | None = None) -> TimeDecision:
    """The mean rule (see trusted_time)."""
    clean = sorted(float(x) for x in samples_ms if isinstance(x, (int, float)) and math.isfinite(x) and x >= 0)
    flags: list[dict[str, str]] = []
    server_ms = None
    if calibration_s is not None and calls > 0:
        server_total_ms = max((loop_s - calibration_s) * 1e3, 0.0)
        server_ms = server_total_ms / calls
    if not clean:
        if server_ms is None:
            raise ValueError("no timing samples and no server clock")
        return TimeDecision(_point(server_ms, calls, meaningful, "server clock (no valid samples claimed)"),
                            "server", server_ms, None,
                            [flag("clock-mismatch", "the candidate's process reported no valid timing samples; "
                                                    "the server's clock was used")])
    claimed = _quantiles(clean, meaningful, "" if meaningful else "CPU wall clock (Triton interpreter): not meaningful")
    mean = sum(clean) / len(clean)
    if server_ms is None:
        return TimeDecision(claimed, "in-process", server_ms, mean, flags)
    # Checked on the CPU too: an interpreter timing means little, but it must not be a lie either.
    calibration_ms = (calibration_s or 0.0) * 1e3
    slack = clock_slack_ms(server_total_ms, calibration_ms)
    gap = server_total_ms - mean * calls
    gross = mean < 0.5 * server_ms and gap > CLOCK_GROSS_FACTOR * slack
    if not meaningful:
        # On the CPU a loaded runner stretches a loop well past its calibration: honest known-good
        # solutions were rejected for tampering at under half the server's clock (docs/concepts/
        # timing.md, "Measurements behind the code"). There only a claim CPU_GROSS_SHARE of the
        # server's time is tampering (a rebound clock claims ~0; a 10x forged one is still caught); a
        # lesser gap reports the server's time, as below.
        gross = gross and mean < CPU_GROSS_SHARE * server_ms
        # ...and of the least-loaded segment's time where the loop had segments: the messages
        # between segments stretch with the load (the same section), while a rebound clock still
        # claims a fraction of the quickest segment.
        if least_segment_ms is not None:
            gross = gross and mean < CPU_GROSS_SHARE * least_segment_ms
        # On the CPU (the interpreter, a shared machine) the loop's own costs vary more: a
        # relative floor on the slack, but a claim beyond it is flagged as on a GPU.
        slack = max(slack, CPU_CLOCK_REL_SLACK * server_total_ms, CPU_CLOCK_ALLOWANCE_MS)
    if gap <= slack:
        return TimeDecision(claimed, "in-process", server_ms, mean, flags)
    message = (f"the candidate's process measured {mean:.4f} ms per call, but the server's clock saw "
               f"{server_ms:.4f} ms per call over the same {calls} calls (the loop's own cost, "
               f"{calibration_ms / calls:.4f} ms per call, removed); the server's time is reported")
    # On the CPU the claim is still not believed (the server's time is reported), but an
    # interpreter timing never decides a win or a reward, and a loaded 2-core machine stretches
    # the loop's own cost between the calibration and the candidate's loop (docs/concepts/
    # timing.md, "Measurements behind the code"): a note, not a review.
    flags.append(flag("clock-mismatch", message, None if meaningful else "info"))
    if gross:
        flags.append(flag("tampering", "in-process clocks disagree with the server's clock: " + message, "reject"))
    return TimeDecision(_point(server_ms, calls, meaningful, "server clock"), "server", server_ms, mean, flags)


def _point(ms: float, reps: int, meaningful: bool, note: str) -> TimingQuantiles:
    return {"median_ms": ms, "q1_ms": ms, "q3_ms": ms, "min_ms": ms, "reps": reps, "meaningful": meaningful,
            "note": note}


def roofline_floor(fingerprint: dict[str, Any], ready: dict[str, Any]) -> tuple[float | None, str]:
    """(floor in ms, how it was computed) for the problem's main inputs on this device: the
    reference's input, output and parameter bytes and the problem's FLOPs against the peaks in
    kernelagent/hardware.py (the one implementation of the bound)."""
    from kernelagent import hardware

    device = hardware.describe_device(fingerprint)
    nbytes = float(ready.get("input_bytes", 0) + ready.get("output_bytes", 0) + ready.get("param_bytes", 0))
    return hardware.roofline_floor(device, nbytes, ready.get("flops"), str(ready.get("output_dtype", "float32")))


def check_roofline(fingerprint: dict[str, Any], ready: dict[str, Any], median_ms: float,
                   margin: float) -> dict[str, str] | None:
    """Class 16: a time below what the hardware allows for the bytes and FLOPs involved."""
    floor_ms, how = roofline_floor(fingerprint, ready)
    if floor_ms is None:
        return flag("roofline", f"impossible-speed check skipped: {how}", "info")
    if median_ms < margin * floor_ms:
        return flag("impossible-speed",
                    f"median {median_ms:.4f} ms is below the roofline floor of {floor_ms:.4f} ms ({how}) on "
                    f"{fingerprint.get('gpu_name', 'this GPU')}: the timing cannot be real (clock patched, "
                    "work skipped or hidden); not counted as a speedup")
    return None
