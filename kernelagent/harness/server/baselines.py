"""The baselines' stage of a job (`Baselines`, the job's `baselines` stage; it gets the job as
seams.BaselineJob): the reference compiles its runners beside other jobs, then times them
holding the device's timing slot (the job's idle probe; the timed loop's memory budget)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelagent.harness import protocol
from kernelagent.harness.server import draws, trace_stage, verdict
from kernelagent.harness.server.gate import add_seconds
from kernelagent.harness.server.stages import ReferenceGone, StageTimeout, Stop

if TYPE_CHECKING:
    from kernelagent.harness.server.seams import BaselineJob


class Baselines:
    """The job's baselines: compiled beside other jobs, timed holding the device's slot."""

    def __init__(self, job: BaselineJob):
        self.job = job
        self._dirs: tuple[Path, Path] | None = None

    def run_baselines(self) -> None:
        job = self.job
        assert job.ref is not None
        modes = list(job.config.compile_modes) if (job.fingerprint.get("cuda") or
                                                   job.config.compile_baseline_on_cpu) else []
        started = time.monotonic()
        inductor_dir, triton_dir = self.baseline_dirs()
        l2 = job.fingerprint.get("l2_bytes")
        protocol.send(job.to_ref, "baselines", job.job_id, job.ref_nonce, compile_modes=modes,
                      l2_bytes=int(l2) if l2 else None, inductor_dir=str(inductor_dir), triton_dir=str(triton_dir),
                      seed=draws.check_seed(job.base_seed, "baselines"), budget_bytes=job.timed.harness_budget() // 2)
        try:
            deadline = job.clock() + job.config.timeouts.baselines
            # The reference compiles every runner first (host work, beside other jobs), then times
            # them holding the device's timing slot. The compile's share of the stage is recorded
            # (a cold `eval` waits for it: issue 59).
            if job.channels.ref_recv({"warmed", "baseline_timings"}, deadline)["type"] == "warmed":
                job.facts.stage_seconds["baselines_compile"] = time.monotonic() - started
                with job.gate.hold(self.job, job.idle_probe if job.fingerprint.get("cuda") else None,
                                   job.concurrency) as hold:
                    timing = time.monotonic()
                    protocol.send(job.to_ref, "go", job.job_id, job.ref_nonce, seed=0)
                    message = job.channels.ref_recv({"baseline_timings"}, deadline)
                    add_seconds(job.concurrency, "slot_baselines_s", time.monotonic() - timing)
                if hold.busy:
                    job.flag(verdict.flag("device-busy", "another process kept the device busy while the baselines "
                                                         "were timed: their times are not clean", "review"))
            else:
                raise ReferenceGone("answered the baselines before compiling them")
            timings = message["timings"]
            for name, value in message["overhead_ms"].items():
                # In each baseline's Timing, so that it is cached with it (result.baseline_overhead_ms).
                if isinstance(timings.get(name), dict) and isinstance(value, (int, float)) \
                        and not isinstance(value, bool):
                    timings[name]["empty_call_ms"] = float(value)
            # Each baseline's device time per call, from the reference's own trace (issue 58).
            clock = trace_stage.baseline_clock(job.ref_trace_channel, modes, timings)
            job.facts.baselines = {"timings": timings, "errors": message["errors"], "device_clock": clock or "trace"}
            for item in baseline_timer_flags(timings):
                job.flag(item)
        except StageTimeout:
            limit = job.config.timeouts.baselines
            job.facts.baselines = {"errors": {"timeout": f"baselines ran past {limit:.0f} s"}}
        except (ReferenceGone, Stop) as exc:
            job.facts.baselines = {"errors": {"reference": f"the reference process {exc}"}}
        job.facts.stage_seconds["baselines"] = time.monotonic() - started
        if not modes and not job.fingerprint.get("cuda"):
            job.facts.baselines.setdefault("skipped", {})["compile"] = \
                "torch.compile baseline skipped on the CPU (pass --compile-baseline-on-cpu to time it anyway)"

    def baseline_dirs(self) -> tuple[Path, Path]:
        """Compile caches the candidate never reached: the caller's shared reference-side cache
        (under the cache root, which every job's jail hides; its entries come only from
        reference processes, so a problem's baselines compile once per machine), else a fresh
        one for this job."""
        if self._dirs is None:
            shared = (self.job.request.get("options") or {}).get("reference_compile_dir")
            if shared:
                self._dirs = (Path(shared) / "inductor", Path(shared) / "triton")
            else:
                inductor_dir = self.job.root / f"baseline-inductor-{uuid.uuid4().hex[:8]}"
                self._dirs = (inductor_dir, inductor_dir / "triton")
        return self._dirs


def baseline_timer_flags(timings: dict[str, Any]) -> list[dict[str, str]]:
    """`throttling` and `launch-bound` flags for freshly timed baselines (the caller adds the
    launch-bound ones for cached baselines). Never raises: the timings stand without flags."""
    from kernelagent.harness.result import Timing, launch_bound_flags, throttling_flag

    flags = []
    for name, data in timings.items():
        try:
            throttled = throttling_flag(f"{name} baseline's", data.get("clocks_mhz"), data.get("samples_ms"))
            if throttled is not None:
                flags.append(verdict.flag(throttled.kind, throttled.message))
            flags += [verdict.flag(f.kind, f.message) for f in launch_bound_flags({name: Timing.from_dict(data)})]
        except (AttributeError, TypeError, ValueError):
            continue
    return flags
