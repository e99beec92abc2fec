"""The shapes of the job record's nested fields (server/job_record.py, issue 57): one TypedDict per
dict a stage writes into the result, with every key some stage writes, its type and what it is.

A TypedDict is a plain dict at runtime, so the wire dict (`JobRecord.to_wire`) is unchanged.
`total=False` marks the keys a stage may not have written (yet); a class split in two (a total
base, an optional rest) says which keys are always there once the field is set.
tests/test_job_record.py runs a CPU evaluation and fails on any key of the wire dict that these
classes do not declare, and scans the server's stages for written keys they do not declare.

Where the values come from a trusted process (the reference's reports, our own clocks) they are
as typed; the candidate's claims reach these dicts only through the server's checks (timed.py
`empty_call_claim`, verdict.trusted_time, checks.py)."""

from __future__ import annotations

from typing import Any, TypedDict


class TimingQuantiles(TypedDict):
    """A time's quantiles (verdict.trusted_time's `timing`): the first fields of result.Timing."""

    median_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    reps: int  # the calls (or segments) behind the quantiles
    meaningful: bool  # False on the CPU / Triton interpreter
    note: str  # where the numbers come from, when not the plain claim


class TimingRecord(TimingQuantiles, total=False):
    """One entry of `timings` (the candidate's, timed.py) or of `baselines.timings` (each runner's,
    from the reference process): result.Timing's fields (caller/results.py reads it with
    Timing.from_dict)."""

    samples_ms: list[float]  # the per-call times behind the quantiles (at most 5000)
    source: str  # "in-process" (the claim, checked) or "server" (the server's own clock)
    clocks_mhz: list[float]  # the SM clock over the loop (NVML): first and last decile; empty without
    empty_call_ms: float | None  # baselines only: the runner's empty call (its per-call overhead)
    server_segments_ms: list[float]  # the candidate only: the server's time per call in each segment
    device_ms: float  # baselines only: the median timed call's kernel time on the trace's device clock


class EmptyCallClaim(TypedDict):
    """What the candidate's timer says it took off every call (timed.empty_call_claim), in ms:
    shown for diagnosis, believed for nothing."""

    event: float  # its empty call's event pair
    host: float  # its host overhead


class TimedLoopPlan(TypedDict):
    """`timed_loop` as timed.py `_timed_loop` first sets it, before the loop runs."""

    calls: int  # measured calls, over all segments
    segments: int  # segments the loop ran in (each clocked by the server)
    warmup_calls: int  # unclocked calls first
    kept: int  # outputs kept per segment for the secret verification
    verified: int  # timed calls verified, chosen in secret
    server_loop_s: float  # the server's clock around the whole loop (0.0 until it ran)
    calibration_s: float | None  # the empty loop's cost (calibration.py); None where none was asked for
    calibration_reused: bool  # the calibration was an earlier job's (or another server's, stored)
    calibration_shared: bool  # the calibration store is shared with other servers of the host
    plan_reused: bool  # the loop's plan was an earlier job's of the same problem and settings
    plan_shared: bool  # that plan was another server's of the host (calibration_store.py), so is its calibration


class TimedLoopRecord(TimedLoopPlan, total=False):
    """`timed_loop` (timed.py, calibration.py): the plan, then what the loop and its checks added."""

    empty_call_ms: EmptyCallClaim | None  # the candidate's claim from the first segment; None if malformed
    calibrations_s: list[float | None]  # both calibrations when it ran again (calibration.recalibrate)
    recalibration_shared: bool  # the second was another server's of the host (calibration_store.py)
    server_ms_per_call: float | None  # the server's time per call (its clock, less the calibration)
    claimed_mean_ms: float | None  # the mean of the candidate's claimed samples
    source: str  # whose numbers `timings["candidate"]` holds: "in-process" or "server"


class DerivedSet(TypedDict):
    """One derived check set (server/draws.py `derived_sets`)."""

    name: str  # the check's name, with its dims
    kind: str  # "extra:<j>"
    overrides: dict[str, Any]  # the module constants it sets (JSON values)
    main: dict[str, Any]  # the same constants' values in the main problem (or the CPU's smoke sizes)


class SkippedSet(TypedDict):
    """A derived set that was not checked (server/checks.py)."""

    name: str  # its check's name
    reason: str  # why (the reference's words, or the record's message)


class DerivedRecord(TypedDict, total=False):
    """`derived` (start.py sets it to {}; memory.py, job.py `derive_check_sets`, checks.py)."""

    note: str  # the CPU's smoke sizes: derived, or why not (memory.py plan_cpu_inputs)
    smoke: dict[str, Any]  # the constants the CPU runs at instead of the main ones
    main: dict[str, Any]  # the main problem's values of those constants
    sets_note: str  # why no check sets were derived (draws.derived_sets)
    sets: list[DerivedSet]  # the derived check sets checked (spares the reference left out dropped)
    skipped: list[SkippedSet]  # derived sets not checked


class BaselinesRecord(TypedDict, total=False):
    """`baselines` (server/baselines.py; job.py on a harness fault): popped by the caller
    (caller/results.merge), which caches the timings."""

    timings: dict[str, TimingRecord]  # per runner ("eager", "compile:<mode>", ...), from the reference
    errors: dict[str, str]  # per runner, or "timeout" / "reference" / "harness": what went wrong
    skipped: dict[str, str]  # per runner: why it was not timed ("compile" on the CPU)
    device_clock: str  # "trace" where each timing has its device_ms, else why none (trace/baseline_clock.py)


class MemoryRecord(TypedDict, total=False):
    """`memory`, in bytes (load.py, memory.py, job.py)."""

    io_bytes: int  # one call's inputs and outputs (the reference's report)
    param_bytes: int  # the model's parameters
    needed_bytes: int | None  # the estimate that did not fit (too_large)
    available_bytes: int | None  # what this machine had for it
    peak_reference_bytes: int  # the reference process's peak (its report)
    peak_candidate_bytes: int  # the candidate process's peak (its claim, an int)


class WorkloadRecord(TypedDict):
    """`workload`: what one call moves (load.py, from the reference's `ref_ready`)."""

    input_bytes: int
    output_bytes: int
    param_bytes: int
    flops: float | None  # the problem's get_flops(), where it has one
    dtype: str  # the output's dtype


class TraceRecord(TypedDict):
    """`trace` (trace_stage.collect): what the kernel trace's channel read."""

    bytes: int  # bytes read
    overflow: bool  # it passed its bound (trace_channel.CAP_BYTES)
    ended: bool  # the candidate's process closed it


class SeedsRecord(TypedDict):
    """`seeds` (Job.run): the evaluation's secret draws (server/draws.py)."""

    base: int  # the master seed (`eval --seed` repeats it)
    secret: bool  # drawn by the server (no --seed)
    trials: list[int]  # each trial's seed
    weights: int  # the weights' seed (EvalConfig.weight_seed)
    compile: int  # the compile seed


class AtLimit(TypedDict, total=False):
    """`concurrency.at_limit` (Job, a stage past its limit): what each process was doing then."""

    candidate: list[str]  # processes.tree_states of the candidate's tree
    reference: list[str]  # the same of the reference's
    candidate_stack: str  # stage 'start' only: the candidate's last Python stacks (processes.start_stacks)


class SlotRecord(TypedDict, total=False):
    """What holding the device's timing slot took (gate.Gate.hold's `stats`), in seconds summed
    over the holds: the job's own `concurrency`, and its `profile_slot` / `evidence_slot`."""

    wait_s: float  # waiting for the slot
    held_s: float  # holding it
    frozen_s: float  # holding it with the other jobs stopped
    held: list[list[float]]  # each hold's [start, end], epoch seconds
    slot_freeze_s: float  # stopping the other jobs (gate.SLOT_PARTS)
    idle_wait_s: float  # the idle probes
    slot_thaw_s: float  # letting the other jobs go again
    bandwidth_wait_s: float  # waiting for quiet memory bandwidth (gate.Bandwidth)
    bandwidth_busy: bool  # the bandwidth never read quiet within gate.BANDWIDTH_WAIT_S


class DeviceLockInfo(TypedDict, total=False):
    """What a job records of the device's host-wide lock (server/device_lock.py `acquire`, through
    admission.Admission.admit): a GPU job only."""

    device_lock: str | None  # "held", "timed out: ...", "unavailable: ..."
    device_lock_wait_s: float  # waiting for it
    admission_wait_s: float  # from the request to its admission, where the first wave is staggered


class ConcurrencyRecord(SlotRecord, DeviceLockInfo, total=False):
    """`concurrency` (Job.conclude_concurrency, gate.describe of `job.concurrency`): what running
    beside other jobs cost this one. The caller adds its own keys after the reply (caller/evaluator.py:
    retried_alone, first_try, first_try_alloc_retries); they are not the server's."""

    slot_calibration_s: float  # in the slot: the calibration (calibration.py)
    slot_warmup_s: float  # the candidate's warm-up (timed.py)
    slot_loop_s: float  # its clocked segments
    slot_compare_s: float  # the comparisons of its kept outputs
    slot_baselines_s: float  # the baselines' timing (baselines.py)
    probe_us: float  # the longest idle probe (Job.idle_probe)
    probes: int  # idle probes run
    copy_us: float  # the slowest bandwidth reading of the probes
    fork_wait_s: float  # waiting for quiet imports before forking (start.py, forking.quiet_imports)
    reference_connections: int | str  # CUDA_DEVICE_MAX_CONNECTIONS in the reference's process, or "default"
    candidate_connections: str  # the candidate's: a number, or "default" and why (processes.candidate_connections)
    job_visible_devices: str  # CUDA_VISIBLE_DEVICES in both (devices.first_visible_device; the server's where unset)
    estimate_s: float  # the device-memory estimate's helper (memory.py)
    estimate_error: str  # why that estimate failed
    memory_wait_s: float  # waiting for device memory in the ledger (memory.py)
    memory_reserved_bytes: int  # the device memory reserved for this job
    memory_beside_bytes: int  # device memory other processes held past ours (failures.py)
    candidate_device_bytes: int  # the candidate's processes' device memory (failures.py, NVML)
    at_limit: AtLimit  # a stage past its limit: the processes' states
    profile_slot: SlotRecord  # the profiled final calls' hold (Job, the profiler)
    evidence_slot: SlotRecord  # the evidence session's holds (server/evidence.py)
    shared_device: bool  # another job ran while this one did
    alone: bool  # the job was run alone (a re-run)
    span: list[float]  # [start, end], epoch seconds
    alloc_retries: dict[str, int]  # per process: the allocator's retries while timed work ran
    retry_alone: bool  # a harness error the caller re-runs alone (Job.retry_alone)
