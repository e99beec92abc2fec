"""What the server's stages use of a job (issue 57: each stage gets what it needs).

The job (server/job.py `Job`) holds its stages as objects (start, channels, load, checks, timed,
baselines, memory, failures), each built with the job and reaching it through the Protocol named here:
the attributes and methods it reads or sets, and the other stages it calls. The stage modules
must not import job.py (it imports them), and evidence.py and trace_stage.py take the job as a
Protocol too. `Job` satisfies them structurally (tests/test_seams.py checks every member against
a built Job). Typing only: nothing here runs."""

from __future__ import annotations

import random
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kernelagent.harness.server.gate import Freezable

if TYPE_CHECKING:
    from kernelagent.harness.config import EvalConfig
    from kernelagent.harness.server.channels import Channels
    from kernelagent.harness.server.checks import Checks
    from kernelagent.harness.server.failures import Failures
    from kernelagent.harness.server.gate import Gate, Hold, MemoryLedger
    from kernelagent.harness.server.load import Load
    from kernelagent.harness.server.memory import Memory
    from kernelagent.harness.server.baselines import Baselines
    from kernelagent.harness.server.timed import TimedLoop
    from kernelagent.harness.server.verdict import CheckRecord
    from kernelagent.harness.trace.channel import Channel, TraceBytes


class TraceJob(Protocol):
    """What trace_stage.py uses of a job: its request, settings and result, the dict its
    processes get, and the trace's channel, bytes and check count (set there)."""

    job_id: str
    request: dict[str, Any]
    config: EvalConfig
    fingerprint: dict[str, Any]
    result: dict[str, Any]
    child_job: dict[str, Any]  # set by Start.fork (server/start.py), before the trace's channel opens
    scratch: Path  # set by Start.fork (server/start.py)
    trace_channel: Channel | None
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


class StageJob(Protocol):
    """What every stage object reads of its job: who it is, its settings and its result, its
    clock (paused while others hold the device), and its one way to fail."""

    job_id: str
    config: EvalConfig
    fingerprint: dict[str, Any]
    result: dict[str, Any]
    stage: str

    def clock(self) -> float: ...

    def limit(self, name: str) -> float: ...

    def fail(self, status: str, reason: str, stage: str | None) -> None: ...


class ChannelJob(StageJob, Protocol):
    """What server/channels.py's Channels uses: the two processes, their pipes and liveness
    descriptors, the reference's nonce and ready message, and the stage the candidate reports."""

    ref: BaseProcess | None
    cand: BaseProcess | None
    to_ref: Connection  # set by Start.fork (server/start.py)
    to_cand: Connection  # set by Start.fork (server/start.py)
    ref_alive_fd: int  # set by Start.fork (server/start.py)
    cand_alive_fd: int  # set by Start.fork (server/start.py)
    ref_nonce: str
    ready: dict[str, Any]
    stage_clock: float
    stage_reports: int
    out_of_memory: bool
    derived_dims: dict[str, tuple[str, str]]
    failures: Failures

    def wait(self, conns: list[Any], deadline: float) -> list[Any]: ...

    def enter(self, name: str) -> None: ...


class LoadJob(StageJob, Protocol):
    """What server/load.py's Load uses: both processes' pipes and liveness descriptors, the
    stage's clock, and the reference's ready message (set there)."""

    to_ref: Connection
    to_cand: Connection
    ref_alive_fd: int
    cand_alive_fd: int
    ready: dict[str, Any]
    stage_clock: float
    channels: Channels

    def wait(self, conns: list[Any], deadline: float) -> list[Any]: ...


class CheckJob(ChannelJob, Protocol):
    """What server/checks.py's Checks uses besides the channels: the seeds' master, the plan and
    its records, the derived sets, the memory ledger, and the job's end (conclude, end_early)."""

    base_seed: int  # set by Job.run
    call_latency_ms: list[float]
    check_records: dict[str, CheckRecord]
    claimed_flags: list[dict[str, str]]  # set by Job.finish_candidate
    derived_overrides: list[dict[str, Any]]
    gate_memory: MemoryLedger | None
    planned: list[str]
    trace_checks: int
    channels: Channels
    load: Load
    memory: Memory
    timed: TimedLoop

    def conclude(self, claimed: list[dict[str, str]]) -> None: ...

    def end_early(self) -> None: ...

    def finish_candidate(self, device_share: bool) -> None: ...


class SlotJob(Freezable, StageJob, Protocol):
    """What a stage that holds the device's timing slot uses (server/gate.py `Gate.hold`): the
    gate, the job's record of what sharing cost, the reference's idle probe, and its flags."""

    gate: Gate
    concurrency: dict[str, Any]
    channels: Channels
    to_ref: Connection
    ref_nonce: str

    def idle_probe(self) -> tuple[bool, bool]: ...

    def flag(self, item: dict[str, str]) -> None: ...


class CalibrationJob(SlotJob, Protocol):
    """What server/calibration.py's Calibration uses: the slot's hold, the secret draws, and the
    candidate's processes stopped around the empty loop."""

    hold: Hold | None
    rng: random.Random

    def stop_candidate(self, stop: bool) -> bool: ...


class TimedJob(CalibrationJob, Protocol):
    """What server/timed.py's TimedLoop uses besides its calibration: the problem, the
    reference's sizes and time, the server's clock on the checks, and the checks' compare."""

    request: dict[str, Any]
    problem_source: str  # set by Start.fork (server/start.py)
    ready: dict[str, Any]
    base_seed: int
    call_latency_ms: list[float]
    planned: list[str]
    checks: Checks
    failures: Failures


class BaselineJob(SlotJob, Protocol):
    """What server/baselines.py's Baselines uses: the reference's process, the caches' roots,
    and the timed loop's memory budget."""

    ref: BaseProcess | None
    request: dict[str, Any]
    root: Path
    base_seed: int
    timed: TimedLoop


class MemoryJob(Freezable, StageJob, Protocol):
    """What server/memory.py's Memory uses: the problem, the gate's estimates and ledger, the
    reference's sizes and last report, and the directories the helpers run in."""

    request: dict[str, Any]
    problem_source: str
    gate: Gate
    gate_memory: MemoryLedger | None
    concurrency: dict[str, Any]
    ready: dict[str, Any]
    root: Path
    refdir: Path  # set by Start.fork (server/start.py)
    ref: BaseProcess | None
    to_ref: Connection
    ref_nonce: str
    alloc_retries: dict[str, int]
    channels: Channels


class FailureJob(StageJob, Protocol):
    """What server/failures.py's Failures uses: the checks so far, the candidate's process and
    log, the ledger's promise, and the verdict's flags and conclusion."""

    cand: BaseProcess | None
    cand_log_fd: int | None  # set by Start.fork (server/start.py)
    check_records: dict[str, CheckRecord]
    claimed_flags: list[dict[str, str]]
    concurrency: dict[str, Any]
    gate_memory: MemoryLedger | None
    memory: Memory

    def flag(self, item: dict[str, str]) -> None: ...

    def conclude(self, claimed: list[dict[str, str]]) -> None: ...


class StartJob(TraceJob, Freezable, Protocol):
    """What server/start.py's Start uses: the job's folders and settings, the jail, the secret
    generator (for the compile seed, not secret), the stages it calls (memory, baselines), and
    everything it sets for the others: the problem, the files, the pipes and the processes."""

    root: Path
    jail: dict[str, Any]
    gate: Gate
    gate_memory: MemoryLedger | None
    concurrency: dict[str, Any]
    rng: random.Random
    memory: Memory
    baselines: Baselines
    # set here
    started: float
    started_epoch: float
    thread_cpu0: float
    refdir: Path
    smoke: bool
    static_flags: dict[str, bool]
    problem_source: str
    cand_log_fd: int | None
    compile_seed: int
    to_ref: Connection
    to_cand: Connection
    ref: BaseProcess | None
    cand: BaseProcess | None
    ref_alive_fd: int
    cand_alive_fd: int
