"""A job's memory: the device memory it reserves beside other jobs (server/gate.py's ledger),
the CPU sizes it runs at, the `too_large` verdict (about the machine, never the candidate), and
the reference's last report of its peak memory (`Memory`, the job's `memory` stage; it gets the
job as seams.MemoryJob)."""

from __future__ import annotations

from typing import TYPE_CHECKING
import contextlib
import hashlib
import math
import time

from kernelagent.harness import protocol
from kernelagent.harness.result import Status
from kernelagent.harness.server import gate as gate_mod, verdict
from kernelagent.harness.server.processes import HELPER_FAILED, forked_device_estimate, forked_plan_cpu_inputs
from kernelagent.harness.server.stages import ReferenceGone, StageTimeout, Stop

if TYPE_CHECKING:
    from kernelagent.harness.server.seams import MemoryJob


# How long the memory plan's estimate (a meta-device build, in a forked helper) may take: under
# 2 s alone on an H100; without it the job reserves from the reference's measured sizes.
ESTIMATE_TIMEOUT_S = 20.0


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / (1 << 30):.1f} GiB"


class Memory:
    """The job's memory: its reservation in the gate's ledger, its CPU sizes, `too_large`."""

    def __init__(self, job: MemoryJob):
        self.job = job
        self.held: contextlib.AbstractContextManager[None] | None = None  # the ledger's reservation, once made

    def reserve_device_memory(self) -> None:
        """Beside other jobs, the device memory this one will use is reserved before its
        processes exist (they allocate the problem while loading): the memory plan's
        meta-device estimate for both processes plus their contexts, made once per problem in a
        throwaway fork. A job that does not fit beside the others waits here, its clock paused.
        Without an estimate the reservation waits for the reference's measured sizes (checks.py)."""
        job = self.job
        key = hashlib.sha256(job.problem_source.encode()).hexdigest()
        sizes = job.gate.estimates.get(key)
        if sizes is None:
            # The harness's own work, not the candidate's: the job's clock is paused meanwhile. A
            # helper forked beside other cold jobs could use up its timeout and with it the job's
            # whole 'start' limit (server/forking.py says why; docs/concepts/concurrency.md,
            # "Measurements behind the code").
            started = time.monotonic()
            job.pause_clock(True)
            try:
                sizes = forked_device_estimate(job.problem_source, job.root, ESTIMATE_TIMEOUT_S)
            finally:
                job.pause_clock(False)
            job.concurrency["estimate_s"] = round(time.monotonic() - started, 3)
            if "error" in sizes:
                job.concurrency["estimate_error"] = str(sizes["error"])[:200]
            if not sizes.get(HELPER_FAILED):  # a helper that hung or died is tried again by the next job
                job.gate.estimates[key] = sizes
        if "error" in sizes or job.gate_memory is None:
            return
        from kernelagent.harness.server import evidence

        # Two processes' contexts, and a third for an evidence session started beside the checks.
        contexts = 3 if evidence.may_want(self.job) else 2
        self.hold_device_memory(gate_mod.job_memory_bytes(sizes["input_bytes"], sizes["output_bytes"],
                                                          sizes["param_bytes"], job.fingerprint.get("free_bytes"),
                                                          contexts=contexts))

    def hold_device_memory(self, need: int) -> None:
        """Reserve `need` bytes in the ledger (waiting, the clock paused, until they fit beside the
        other jobs), held until release_device_memory; the wait and the bytes recorded."""
        job = self.job
        self.held = job.gate_memory.reserve(self.job, need)
        waited = time.monotonic()
        self.held.__enter__()
        job.concurrency["memory_wait_s"] = round(time.monotonic() - waited, 3)
        job.concurrency["memory_reserved_bytes"] = int(need)

    def release_device_memory(self) -> None:
        if self.held is not None:
            self.held.__exit__(None, None, None)
            self.held = None

    def plan_cpu_inputs(self) -> str:
        """On the CPU, for a problem without get_smoke_inputs(): the sizes the whole job runs at
        (derive.plan_cpu_inputs, in a forked helper). Returns the result's input_set, or
        Status.TOO_LARGE after setting that verdict."""
        job = self.job
        started = time.monotonic()
        source = job.request["problem_source"]
        plan = forked_plan_cpu_inputs(source, job.refdir, job.limit("start"))
        job.facts.stage_seconds["derive"] = time.monotonic() - started
        if "error" in plan:
            job.facts.derived["note"] = f"smoke sizes were not derived: {plan['error']}"
            # Never the main sizes blindly: the static estimate (fp32 assumed) must fit.
            from kernelagent.harness import derive

            try:
                shapes = derive.input_shapes(source)
            except SyntaxError:
                shapes = None
            needed = None if shapes is None else 2 * 4 * 4 * sum(math.prod(s) for s in shapes)
            available = derive.available_memory()
            if needed is not None and available is not None and needed > available:
                self.too_large(needed, available, job.facts.derived["note"])
                return Status.TOO_LARGE
            return "main"
        job.facts.derived["note"] = str(plan.get("note", ""))
        if plan.get("input_set") == "derived-smoke":
            from kernelagent.harness import derive

            overrides = plan["overrides"]
            env = derive.Module(source).env()
            job.problem_source = derive.apply(source, overrides)
            job.facts.derived.update(smoke=overrides, main={k: env.get(k) for k in overrides})
            return "derived-smoke"
        if plan.get("input_set") == "too_large":
            self.too_large(plan.get("needed_bytes"), plan.get("available_bytes"),
                           "the problem's inputs do not fit in this machine's memory and no smaller CPU sizes "
                           f"could be derived: {plan.get('note', '')}")
            return Status.TOO_LARGE
        return "main"

    def too_large(self, needed: int | None, available: int | None, detail: str) -> None:
        """The verdict about the machine (never the candidate): the problem does not fit. General:
        any memory estimate (CPU or device) that fails reports through here."""
        self.job.facts.memory.update(needed_bytes=needed, available_bytes=available)
        self.job.fail(Status.TOO_LARGE, f"too large for this machine: needs about {_gib(needed)}, "
                                        f"{_gib(available)} available; {detail}", "start")

    def memory_context(self) -> str:
        job = self.job
        gib = 1 << 30
        io = int(job.ready.get("input_bytes", 0)) + int(job.ready.get("output_bytes", 0))
        free = job.fingerprint.get("free_bytes")
        where = f"; {free / gib:.1f} GiB were free on the device before the job" if free else ""
        return f"the problem's inputs and outputs take {io / gib:.2f} GiB{where}"

    def reference_stats(self) -> None:
        job = self.job
        if job.ref is None or not job.ref.is_alive():
            return
        try:
            protocol.send(job.to_ref, "exit", job.job_id, job.ref_nonce)
            message = job.channels.ref_recv({"ref_stats"}, job.clock() + 10)
            peak = message["memory"].get("peak_bytes")
            if isinstance(peak, int):
                job.facts.memory["peak_reference_bytes"] = peak
            job.alloc_retries["reference"] = verdict.count_claim(message["memory"].get("alloc_retries"))
        except (StageTimeout, ReferenceGone, Stop, OSError, protocol.ProtocolError):
            pass
