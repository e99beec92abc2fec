"""What the server's stages use of a job (issue 57: each stage gets what it needs).

The job (server/job.py `Job`) holds its stages as objects (start, channels, load, checks, timed
with its calibration, baselines, memory, failures), each built with the job and reaching it
through the Protocol named here: exactly the attributes and methods it reads or sets and the
other stages it calls, plus the Protocols of those it hands the job on to (the gate's Freezable,
the trace's and the evidence's). The stage modules must not import job.py (it imports them), and
evidence.py and trace_stage.py take the job as a Protocol too. The stage objects those Protocols
name (`CheckJob.channels`, `StartJob.baselines`, ...) are typed by Protocols here too
(ChannelsStage, ChecksStage, ...): exactly what the other stages use of each, so this module
imports no stage module (they import it: that was an import circle). `Job` and the stage classes
satisfy them structurally; tests/test_seams.py checks every member against a built Job and the
stage classes, and each stage's code against its Protocol. Typing only: nothing here runs."""

from __future__ import annotations

import random
from contextlib import AbstractContextManager
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kernelagent.harness.server.gate import Freezable

if TYPE_CHECKING:
    from kernelagent.harness.config import EvalConfig
    from kernelagent.harness.server.gate import Gate, Hold, MemoryLedger
    from kernelagent.harness.server.job_record import JobRecord
    from kernelagent.harness.server.verdict import CheckRecord
    from kernelagent.harness.trace.channel import Channel, TraceBytes


# The stage objects, as the other stages use them (signatures copied from the stage classes).

class ChannelsStage(Protocol):
    """What the stages use of server/channels.py's Channels: the reads of both pipes, the sends
    to the candidate, and the bounds on the candidate's tensors."""

    def cand_recv(self, accept: set[str], deadline: float, max_bytes: int = ...,
                  stage_deadlines: bool = False) -> dict[str, Any]: ...

    def cand_send(self, msg_type: str, /, *, decided: bool = False, **fields: Any) -> None: ...

    def payload_limit(self, extra: bool = False, kind: str | None = None) -> int: ...

    def ref_recv(self, accept: set[str], deadline: float) -> dict[str, Any]: ...

    def relay_payloads(self, records: list[Any], deadline: float, limit: int = ...) -> list[bytes]: ...


class ChecksStage(Protocol):
    """What the timed loop uses of server/checks.py's Checks: the reference's verdict on one check."""

    def compare(self, check: dict[str, Any], n_outputs: int, outputs: list[Any], inputs: list[Any],
                payloads: list[bytes], deadline: float, candidate_error: str | None = None,
                keep_cache: bool = False, seconds: dict[str, float] | None = None) -> CheckRecord: ...


class FailuresStage(Protocol):
    """What the stages use of server/failures.py's Failures: the candidate's failure report, the
    server's reading of its data, and the blame for the device's memory."""

    def blame_device_memory(self) -> bool: ...

    def candidate_failure(self, message: dict[str, Any]) -> None: ...

    def handling_candidate(self, what: str) -> AbstractContextManager[None]: ...


class LoadStage(Protocol):
    """What the checks use of server/load.py's Load."""

    def await_ready_and_compiled(self) -> None: ...


class MemoryStage(Protocol):
    """What the stages use of server/memory.py's Memory: the ledger's reservations and the
    problem's sizes on the CPU, and the memory's context for a failure's message."""

    held: AbstractContextManager[None] | None  # the ledger's reservation, once made

    def hold_device_memory(self, need: int) -> None: ...

    def memory_context(self) -> str: ...

    def plan_cpu_inputs(self) -> str: ...

    def release_device_memory(self) -> None: ...

    def reserve_device_memory(self) -> None: ...


class BaselinesStage(Protocol):
    """What the start uses of server/baselines.py's Baselines: the reference's compile caches."""

    def baseline_dirs(self) -> tuple[Path, Path]: ...


class TimedStage(Protocol):
    """What the stages use of server/timed.py's TimedLoop: the loop itself and the harness's
    memory budget."""

    def harness_budget(self) -> int: ...

    def timed_loop(self, deadline: float) -> bool: ...


class TraceJob(Protocol):
    """What trace_stage.py uses of a job: its request, settings and record (`facts`), the dict its
    processes get, and the trace's channel, bytes and check count (set there)."""

    job_id: str
    request: dict[str, Any]
    config: EvalConfig
    fingerprint: dict[str, Any]
    facts: JobRecord  # what the result says (server/job_record.py)
    child_job: dict[str, Any]  # set by Start.fork (server/start.py), before the trace's channel opens
    scratch: Path  # set by Start.fork (server/start.py)
    trace_channel: Channel | None
    ref_trace_channel: Channel | None  # the reference's own (issue 58: its baselines' device times)
    trace: TraceBytes | None
    trace_checks: int


class EvidenceJob(TraceJob, Freezable, Protocol):
    """What evidence.py uses of a job, besides what the trace's stage does (it calls
    trace_stage.judge) and what the gate's slot does (it holds the slot for the session)."""

    jail: dict[str, Any]
    root: Path
    gate: Gate
    concurrency: dict[str, Any]
    cpu: dict[str, float]
    early_evidence: Any  # kernel_evidence.Early (or a spare of it), or None
    early_counted: bool

    def enter(self, name: str) -> None: ...

    def limit(self, name: str) -> float: ...

    def idle_probe(self) -> tuple[bool, bool]: ...



class StartJob(TraceJob, Freezable, Protocol):
    """What server/start.py's Start uses of the job: its folders, settings and jail, the stages it
    calls (memory, baselines), and what it sets for the others: the problem, the files, the
    pipes and the processes. It hands the job on to trace_stage.open_for (TraceJob) and to the
    gate (Freezable)."""

    baselines: BaselinesStage
    baselines_only: bool  # a baselines job: the reference's process only (Job.run_baselines_only)
    cand: BaseProcess | None
    cand_alive_fd: int  # set by Start.fork (server/start.py)
    cand_log_fd: int | None  # set by Start.fork (server/start.py)
    compile_seed: int
    concurrency: dict[str, Any]
    gate: Gate
    gate_memory: MemoryLedger | None
    jail: dict[str, Any]
    memory: MemoryStage
    problem_source: str  # set by Start.fork (server/start.py)
    ref: BaseProcess | None
    ref_alive_fd: int  # set by Start.fork (server/start.py)
    refdir: Path  # set by Start.fork (server/start.py)
    rng: random.Random
    root: Path
    smoke: bool
    started: float
    started_epoch: float
    static_flags: dict[str, bool]
    thread_cpu0: float
    to_cand: Connection  # set by Start.fork (server/start.py)
    to_ref: Connection  # set by Start.fork (server/start.py)


class ChannelJob(Protocol):
    """What server/channels.py's Channels uses of the job: the two processes, their pipes and
    liveness descriptors, the reference's nonce and ready message, and the stage the candidate
    reports."""

    cand: BaseProcess | None
    cand_alive_fd: int  # set by Start.fork (server/start.py)
    config: EvalConfig
    derived_dims: dict[str, tuple[str, str]]
    failures: FailuresStage
    job_id: str
    out_of_memory: bool
    ready: dict[str, Any]
    ref: BaseProcess | None
    ref_alive_fd: int  # set by Start.fork (server/start.py)
    ref_nonce: str
    stage: str
    stage_clock: float
    stage_reports: int
    to_cand: Connection  # set by Start.fork (server/start.py)
    to_ref: Connection  # set by Start.fork (server/start.py)

    def clock(self) -> float: ...

    def enter(self, name: str) -> None: ...

    def fail(self, status: str, reason: str, stage: str | None) -> None: ...

    def limit(self, name: str) -> float: ...

    def wait(self, conns: list[Any], deadline: float) -> list[Any]: ...


class LoadJob(Protocol):
    """What server/load.py's Load uses of the job: both processes' pipes and liveness descriptors,
    the stage's clock, and the reference's ready message (set there)."""

    cand_alive_fd: int  # set by Start.fork (server/start.py)
    channels: ChannelsStage
    ready: dict[str, Any]
    ref_alive_fd: int  # set by Start.fork (server/start.py)
    facts: JobRecord  # what the result says (server/job_record.py)
    stage: str
    stage_clock: float
    to_cand: Connection  # set by Start.fork (server/start.py)
    to_ref: Connection  # set by Start.fork (server/start.py)

    def clock(self) -> float: ...

    def limit(self, name: str) -> float: ...

    def wait(self, conns: list[Any], deadline: float) -> list[Any]: ...


class CheckJob(EvidenceJob, Protocol):
    """What server/checks.py's Checks uses of the job: the seeds' master, the plan and its records,
    the derived sets, the memory ledger, the stages it calls, and the job's end (conclude,
    end_early). It hands the job on to the evidence's early start (EvidenceJob)."""

    base_seed: int  # set by Job.run
    call_latency_ms: list[float]
    cand: BaseProcess | None
    channels: ChannelsStage
    check_records: dict[str, CheckRecord]
    claimed_flags: list[dict[str, str]]  # set by Job.finish_candidate
    derived_dims: dict[str, tuple[str, str]]
    derived_overrides: list[dict[str, Any]]
    failures: FailuresStage
    gate_memory: MemoryLedger | None
    load: LoadStage
    memory: MemoryStage
    out_of_memory: bool
    planned: list[str]
    ready: dict[str, Any]
    ref: BaseProcess | None
    ref_nonce: str
    timed: TimedStage
    to_ref: Connection  # set by Start.fork (server/start.py)

    def clock(self) -> float: ...

    def conclude(self, claimed: list[dict[str, str]]) -> None: ...

    def end_early(self) -> None: ...

    def finish_candidate(self, device_share: bool) -> None: ...


class CalibrationJob(Protocol):
    """What server/calibration.py's Calibration uses of the job: the reference's pipe, the slot's
    hold, the secret draws, the gate's stored calibrations, and the candidate's processes
    stopped around the empty loop."""

    channels: ChannelsStage
    concurrency: dict[str, Any]
    config: EvalConfig
    fingerprint: dict[str, Any]
    gate: Gate
    hold: Hold | None
    job_id: str
    ref_nonce: str
    facts: JobRecord  # what the result says (server/job_record.py)
    rng: random.Random
    to_ref: Connection  # set by Start.fork (server/start.py)

    def stop_candidate(self, stop: bool) -> bool: ...


class TimedJob(CalibrationJob, Freezable, Protocol):
    """What server/timed.py's TimedLoop uses of the job: the problem, the reference's sizes and
    time, the server's clock on the checks, the checks' compare, and the device's timing slot.
    It hands the job on to its calibration (CalibrationJob) and to the gate (Freezable)."""

    base_seed: int  # set by Job.run
    call_latency_ms: list[float]
    checks: ChecksStage
    failures: FailuresStage
    planned: list[str]
    problem_source: str  # set by Start.fork (server/start.py)
    ready: dict[str, Any]
    request: dict[str, Any]

    def clock(self) -> float: ...

    def flag(self, item: dict[str, str]) -> None: ...

    def idle_probe(self) -> tuple[bool, bool]: ...


class BaselineJob(Freezable, Protocol):
    """What server/baselines.py's Baselines uses of the job: the reference's process and pipe, the
    caches' roots, the timed loop's memory budget, and the device's timing slot. It hands the
    job on to the gate (Freezable)."""

    base_seed: int  # set by Job.run
    channels: ChannelsStage
    concurrency: dict[str, Any]
    config: EvalConfig
    fingerprint: dict[str, Any]
    gate: Gate
    ref: BaseProcess | None
    ref_nonce: str
    ref_trace_channel: Channel | None  # the reference's trace (server/trace_stage.py; issue 58)
    request: dict[str, Any]
    facts: JobRecord  # what the result says (server/job_record.py)
    root: Path
    timed: TimedStage
    to_ref: Connection  # set by Start.fork (server/start.py)

    def clock(self) -> float: ...

    def flag(self, item: dict[str, str]) -> None: ...

    def idle_probe(self) -> tuple[bool, bool]: ...


class MemoryJob(EvidenceJob, Protocol):
    """What server/memory.py's Memory uses of the job: the problem, the gate's estimates and
    ledger, the reference's sizes and last report, and the folders the helpers run in. It hands
    the job on to the ledger (Freezable) and to evidence.may_want (EvidenceJob)."""

    alloc_retries: dict[str, int]
    channels: ChannelsStage
    gate_memory: MemoryLedger | None
    problem_source: str  # set by Start.fork (server/start.py)
    ready: dict[str, Any]
    ref: BaseProcess | None
    ref_nonce: str
    refdir: Path  # set by Start.fork (server/start.py)
    to_ref: Connection  # set by Start.fork (server/start.py)

    def clock(self) -> float: ...

    def fail(self, status: str, reason: str, stage: str | None) -> None: ...


class FailureJob(Protocol):
    """What server/failures.py's Failures uses of the job: the checks so far, the candidate's
    process and log, the ledger's promise, and the verdict's flags and conclusion."""

    cand: BaseProcess | None
    cand_log_fd: int | None  # set by Start.fork (server/start.py)
    check_records: dict[str, CheckRecord]
    claimed_flags: list[dict[str, str]]  # set by Job.finish_candidate
    concurrency: dict[str, Any]
    fingerprint: dict[str, Any]
    gate_memory: MemoryLedger | None
    memory: MemoryStage
    facts: JobRecord  # what the result says (server/job_record.py)
    stage: str

    def conclude(self, claimed: list[dict[str, str]]) -> None: ...

    def fail(self, status: str, reason: str, stage: str | None) -> None: ...

    def flag(self, item: dict[str, str]) -> None: ...
