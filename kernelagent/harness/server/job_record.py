"""What a job records for its result (issue 57): one typed field per key of the result the server
sends, in place of the untyped dict its stages used to write. The job holds it as `job.facts`
(`Job.record` is the verdict fold's entry); each stage writes the fields its Protocol names
(server/seams.py).

- `status`, `reason`, `stage`, `correct`: written only by the verdict fold (harness/verdict.py
  `apply_to`, from `Job.record`); tests/test_verdict_fold.py scans for any other writer.
- The fields the result always had (compiled ... memory) have their empty defaults.
- The others (`OPTIONAL`) are None until a stage sets them and are then left out of the wire
  dict, as the result left those keys out before anything set them (the caller's merge,
  caller/results.py, keeps its EvalResult's defaults for absent keys).

`to_wire()` is the dict the server sends (server/main.py `_run_job`, then protocol.json_safe):
the same keys and the same values as the result dict it replaces, its containers the record's own.
The nested dicts' shapes (every key a stage writes, its type) are TypedDicts in
server/record_types.py: plain dicts at runtime, so the wire is unchanged; `evidence` stays a dict
(server/evidence.py builds it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kernelagent.harness.server.record_types import (BaselinesRecord, ConcurrencyRecord, DerivedRecord, MemoryRecord,
                                                     SeedsRecord, TimedLoopRecord, TimingRecord, TraceRecord,
                                                     WorkloadRecord)

# The result's keys that a stage may never set: absent from the wire until one does.
OPTIONAL = ("log", "derived", "timed_loop", "baselines", "evidence", "workload", "trace", "seeds", "input_set",
            "device", "concurrency")


@dataclass
class JobRecord:
    # the verdict (harness/verdict.py): the fold's only
    status: str | None = None
    reason: str = ""
    stage: str | None = None
    correct: bool = False
    # always in the result
    compiled: bool = False  # the candidate loaded (server/load.py), or nvcc built it (precompile)
    trials: list[dict[str, Any]] = field(default_factory=list)  # each check's record (server/checks.py)
    timings: dict[str, TimingRecord] = field(default_factory=dict)  # "candidate": result.Timing's fields
    flags: list[dict[str, str]] = field(default_factory=list)  # {"kind", "message", "severity"}
    stage_seconds: dict[str, float] = field(default_factory=dict)  # the stage clocks, CPU seconds, totals
    kernels: list[dict[str, Any]] = field(default_factory=list)  # the candidate's profiler rows (trusted_kernel_rows)
    memory: MemoryRecord = field(default_factory=MemoryRecord)  # bytes: io, params, needed, available, peaks
    # set by a stage, absent before (OPTIONAL)
    log: str | None = None  # the candidate's log tail, the reference's on our faults
    derived: DerivedRecord | None = None  # derived smoke sizes and check sets (server/memory.py, job.py)
    timed_loop: TimedLoopRecord | None = None  # the loop's plan and clocks (server/timed.py, calibration.py)
    baselines: BaselinesRecord | None = None  # {"timings", "errors", "skipped"} (server/baselines.py)
    evidence: dict[str, Any] | None = None  # the kernel evidence (server/evidence.py)
    workload: WorkloadRecord | None = None  # what one call moves (server/load.py)
    trace: TraceRecord | None = None  # {"bytes", "overflow", "ended"} (server/trace_stage.py)
    seeds: SeedsRecord | None = None  # the master seed and each check's (Job.run)
    input_set: str | None = None  # "main" or "smoke" (server/start.py)
    device: str | None = None  # the GPU's name or "cpu" (server/start.py)
    concurrency: ConcurrencyRecord | None = None  # gate.describe of running beside others (Job.conclude_concurrency)

    def to_wire(self) -> dict[str, Any]:
        """The result dict the server sends: every field, less the OPTIONAL ones never set."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if not (f.name in OPTIONAL and getattr(self, f.name) is None)}
