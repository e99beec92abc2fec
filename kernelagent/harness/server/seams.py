"""What the server's stage modules use of a job (issue 57: each stage gets what it needs).

evidence.py and trace_stage.py take the job (server/job.py `Job`) but must not import it (job.py
imports them); these Protocols name exactly the attributes and methods they read or set, and
`Job` satisfies them structurally (tests/test_layout.py checks every member against a built Job).
Typing only: nothing here runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kernelagent.harness.server.gate import Freezable

if TYPE_CHECKING:
    from kernelagent.harness.config import EvalConfig
    from kernelagent.harness.server.gate import Gate
    from kernelagent.harness.trace.channel import Channel, TraceBytes


class TraceJob(Protocol):
    """What trace_stage.py uses of a job: its request, settings and result, the dict its
    processes get, and the trace's channel, bytes and check count (set there)."""

    job_id: str
    request: dict[str, Any]
    config: EvalConfig
    fingerprint: dict[str, Any]
    result: dict[str, Any]
    child_job: dict[str, Any]  # set by Job.fork, before the trace's channel opens
    scratch: Path  # set by Job.fork
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
