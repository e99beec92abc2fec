"""The baselines' phase of a job: the reference compiles its runners beside other jobs, then
times them holding the device's timing slot (mixed into server/job.py's Job through
server/timed.py's TimedPhases, whose idle probe and memory budget it uses)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from kernelagent.harness import protocol
from kernelagent.harness.server import draws, verdict
from kernelagent.harness.server.gate import add_seconds
from kernelagent.harness.server.stages import ReferenceGone, StageTimeout, _Stop


class BaselinePhases:
    """Job's baselines (needs Job's channels, clock and gate, and TimedPhases' idle probe)."""

    def run_baselines(self) -> None:
        assert self.ref is not None
        modes = list(self.config.compile_modes) if (self.fingerprint.get("cuda") or
                                                    self.config.compile_baseline_on_cpu) else []
        started = time.monotonic()
        inductor_dir, triton_dir = self.baseline_dirs()
        l2 = self.fingerprint.get("l2_bytes")
        protocol.send(self.to_ref, "baselines", self.job_id, self.ref_nonce, compile_modes=modes,
                      l2_bytes=int(l2) if l2 else None, inductor_dir=str(inductor_dir), triton_dir=str(triton_dir),
                      seed=draws.check_seed(self.base_seed, "baselines"), budget_bytes=self.harness_budget() // 2)
        try:
            deadline = self.clock() + self.config.timeouts.baselines
            # The reference compiles every runner first (host work, beside other jobs), then times
            # them holding the device's timing slot.
            if self.ref_recv({"warmed", "baseline_timings"}, deadline)["type"] == "warmed":
                with self.gate.hold(self, self.idle_probe if self.fingerprint.get("cuda") else None,
                                    self.concurrency) as hold:
                    timing = time.monotonic()
                    protocol.send(self.to_ref, "go", self.job_id, self.ref_nonce, seed=0)
                    message = self.ref_recv({"baseline_timings"}, deadline)
                    add_seconds(self.concurrency, "slot_baselines_s", time.monotonic() - timing)
                if hold.busy:
                    self.flag(verdict.flag("device-busy", "another process kept the device busy while the baselines "
                                                          "were timed: their times are not clean", "review"))
            else:
                raise ReferenceGone("answered the baselines before compiling them")
            timings = message["timings"]
            for name, value in message["overhead_ms"].items():
                # In each baseline's Timing, so that it is cached with it (result.baseline_overhead_ms).
                if isinstance(timings.get(name), dict) and isinstance(value, (int, float)) \
                        and not isinstance(value, bool):
                    timings[name]["empty_call_ms"] = float(value)
            self.result["baselines"] = {"timings": timings, "errors": message["errors"]}
            for item in baseline_timer_flags(timings):
                self.flag(item)
        except StageTimeout:
            limit = self.config.timeouts.baselines
            self.result["baselines"] = {"errors": {"timeout": f"baselines ran past {limit:.0f} s"}}
        except (ReferenceGone, _Stop) as exc:
            self.result["baselines"] = {"errors": {"reference": f"the reference process {exc}"}}
        self.result["stage_seconds"]["baselines"] = time.monotonic() - started
        if not modes and not self.fingerprint.get("cuda"):
            self.result["baselines"].setdefault("skipped", {})["compile"] = \
                "torch.compile baseline skipped on the CPU (pass --compile-baseline-on-cpu to time it anyway)"

    def baseline_dirs(self) -> tuple[Path, Path]:
        """Compile caches the candidate never reached: the caller's shared reference-side cache
        (under the cache root, which every job's jail hides; its entries come only from
        reference processes, so a problem's baselines compile once per machine), else a fresh
        one for this job."""
        if not hasattr(self, "_baseline_dirs"):
            shared = (self.request.get("options") or {}).get("reference_compile_dir")
            if shared:
                self._baseline_dirs = (Path(shared) / "inductor", Path(shared) / "triton")
            else:
                inductor_dir = self.root / f"baseline-inductor-{uuid.uuid4().hex[:8]}"
                self._baseline_dirs = (inductor_dir, inductor_dir / "triton")
        return self._baseline_dirs


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
