"""A job's supervision loop (`Checks`, the job's `checks` stage; it gets the job as
seams.CheckJob): the load and compile stage awaited (server/load.py), then each correctness
check, its outputs relayed to the trusted reference and compared there, then the timed loop's
stage (server/timed.py) and the end (server/job.py: finish_candidate, conclude)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kernelagent.harness import protocol
from kernelagent.harness.server import draws, gate as gate_mod
from kernelagent.harness.server.verdict import CheckRecord

from kernelagent.harness.server.stages import ReferenceGone, Stop

if TYPE_CHECKING:
    from kernelagent.harness.server.seams import CheckJob


class Checks:
    """The job's supervision loop and its correctness checks."""

    def __init__(self, job: CheckJob):
        self.job = job

    def supervise(self) -> None:
        try:
            self._supervise()
        except Stop:
            pass
        finally:
            self.job.memory.release_device_memory()

    def _supervise(self) -> None:
        job = self.job
        assert job.ref is not None and job.cand is not None
        config = job.config
        # 1. start, load, compile: the reference gets ready while the candidate imports.
        job.load.await_ready_and_compiled()
        if config.compile_only:
            job.channels.cand_recv({"done"}, job.clock() + 30)
            job.conclude([])
            return

        # 2. correctness: each check's seed revealed only when it runs. Beside other jobs, the
        # device's memory for this one is reserved first (server/gate.py MemoryLedger).
        self._reserve_device_memory()
        job.enter("correctness")
        deadline = job.clock() + job.limit("correctness")
        job.channels.cand_send("plan",
                               reference_ops=job.ready.get("reference_ops", []) if config.defences else [])
        # Each check's seed is keyed by the secret master (server/draws.py): one says nothing of another.
        base = job.base_seed
        checks = self._plan_checks(base)
        job.planned = [c["name"] for c in checks]
        for check in checks:
            if not self.run_check(check, deadline):
                return job.end_early()

        # 3. the timed loop, clocked here.
        if config.timing and not self._timing_stages(base):
            return job.end_early()

        # 4. the end: evidence, profile, flags.
        job.finish_candidate(device_share=bool(config.defences and job.fingerprint.get("cuda")))
        job.conclude(job.claimed_flags)

    def _reserve_device_memory(self) -> None:
        """Beside other jobs, this job's share of the device's memory (from the reference's
        workload), held from here on; the wait for it recorded."""
        job = self.job
        ready = job.ready
        need = gate_mod.job_memory_bytes(int(ready.get("input_bytes", 0)), int(ready.get("output_bytes", 0)),
                                         int(ready.get("param_bytes", 0)), job.fingerprint.get("free_bytes"))
        if job.memory.held is None and job.gate_memory is not None:  # no estimate before the fork
            job.memory.hold_device_memory(need)

    def _plan_checks(self, base: int) -> list[dict[str, Any]]:
        """The correctness checks in order (trials, the alternative inputs, the extra input sets
        the reference planned), each with its seed; the derived sets not checked are dropped or
        recorded as skipped. ReferenceGone when the reference plans a set that does not exist."""
        job = self.job
        config = job.config
        checks = [{"name": f"trial {i}", "kind": "main", "seed": draws.check_seed(base, f"trial {i}"), "stop": True}
                  for i in range(config.trials)]
        if job.ready.get("alt"):
            checks.append({"name": "signed-normal inputs", "kind": "alt", "seed": draws.check_seed(base, "alt"),
                           "stop": True})
        if job.ready.get("near_one"):
            checks.append({"name": "inputs near one", "kind": "near-one", "seed": draws.check_seed(base, "near-one"),
                           "stop": True})
        derived_names = {d["kind"]: d["name"] for d in job.facts.derived.get("sets", [])}
        for kind, why in job.ready.get("extra_skipped", {}).items():
            job.facts.derived.setdefault("skipped", []).append(
                {"name": derived_names.get(kind, kind), "reason": f"skipped: {why}"[:600]})
        n_extra = int(job.ready.get("n_extra", 0))
        extra_plan = list(job.ready.get("extra_plan", range(n_extra)))
        if "sets" in job.facts.derived:  # the derived sets checked (spares the reference left out dropped)
            job.facts.derived["sets"] = [d for d in job.facts.derived["sets"]
                                             if int(d["kind"].split(":")[1]) in extra_plan]
        for j in extra_plan:
            if not isinstance(j, int) or not 0 <= j < n_extra:
                raise ReferenceGone(f"planned an extra input set that does not exist ({j!r})")
            checks.append({"name": derived_names.get(f"extra:{j}", f"extra input set {j}"), "kind": f"extra:{j}",
                           "seed": draws.check_seed(base, f"extra:{j}"), "stop": False})
        return checks

    def _timing_stages(self, base: int) -> bool:
        """Stage 3: the timed loop, then (when asked) the post-timing check. True to go on."""
        job = self.job
        config = job.config
        job.enter("timing")
        # The checks passed: if no early evidence session could start beside them (the
        # server's cap on live ones), one may start now, beside the timed loop's wait.
        from kernelagent.harness.server import evidence

        evidence.start_early(self.job)
        if not job.timed.timed_loop(job.clock() + job.limit("timing")):
            return False
        if config.post_timing_check:
            job.enter("post-check")
            post = {"name": "post-timing check", "kind": "main", "seed": draws.check_seed(base, "post-timing"),
                    "stop": True}
            job.planned.append(post["name"])
            if not self.run_check(post, job.clock() + job.limit("post-check")):
                return False
        return True

    def run_check(self, check: dict[str, Any], deadline: float) -> bool:
        """One check: the candidate runs it, the reference compares. True to go on."""
        job = self.job
        # A derived set's shapes reach the candidate's process with its own check, never before.
        overrides = job.derived_overrides[int(check["kind"].split(":")[1])] \
            if check["kind"].startswith("extra:") and job.derived_overrides else None
        job.channels.cand_send("run_check", name=check["name"], kind=check["kind"], seed=check["seed"],
                               overrides=overrides)
        job.trace_checks = getattr(self.job, "trace_checks", 0) + 1  # one CHECK marker pair each (trace_stage)
        sent = time.perf_counter()
        message = job.channels.cand_recv({"outputs"}, deadline)
        if check["kind"] == "main":
            # The server's own clock on one call (input generation and the hand-over included):
            # an upper bound of the call's time, from which the timed loop is sized.
            job.call_latency_ms.append((time.perf_counter() - sent) * 1e3)
        if message["name"] != check["name"]:
            raise protocol.ProtocolError(f"outputs for {message['name'][:40]!r} when {check['name']!r} was asked")
        error = message["error"]
        if error is not None and (not check["kind"].startswith("extra:") or message["outputs"] or message["inputs"]):
            # Only an extra input set may be answered with the exception it raised (then it is
            # compared as a failure, unless the reference cannot run that set either).
            raise protocol.ProtocolError(f"an error instead of outputs for {check['name']!r}")
        limit = job.channels.payload_limit(check["kind"].startswith("extra:"), check["kind"])
        answered = time.perf_counter()
        payloads = job.channels.relay_payloads(message["outputs"] + message["inputs"], deadline, limit)
        relayed = time.perf_counter()
        record = self.compare(check, message["n_outputs"], message["outputs"], message["inputs"], payloads, deadline,
                              candidate_error=error[:4000] if error is not None else None,
                              seconds={"candidate": answered - sent, "relay": relayed - answered})
        stop = not record.passed and check["stop"]
        job.channels.cand_send("check_reply", decided=stop, passed=record.passed, stop=stop)
        return not stop

    def compare(self, check: dict[str, Any], n_outputs: int, outputs: list[Any], inputs: list[Any],
                payloads: list[bytes], deadline: float, candidate_error: str | None = None,
                keep_cache: bool = False, seconds: dict[str, float] | None = None) -> CheckRecord:
        """The reference's verdict on one check; it gives its cached device memory back after the
        check unless `keep_cache` (between the timed loop's segments). `seconds`: the server's
        clock on the check's earlier parts, recorded with the reference's own."""
        job = self.job
        protocol.send(job.to_ref, "check", job.job_id, job.ref_nonce, name=check["name"], kind=check["kind"],
                      seed=check["seed"], n_outputs=n_outputs, outputs=outputs, inputs=inputs,
                      stop_on_failure=bool(check.get("stop", True)), candidate_error=candidate_error,
                      keep_cache=keep_cache)
        asked = time.perf_counter()
        for data in payloads:
            protocol.send_payload(job.to_ref, data)
        record = CheckRecord.from_message(job.channels.ref_recv({"verdict"}, deadline))
        self.record_check(record, {**(seconds or {}), "reference": time.perf_counter() - asked})
        return record

    def record_check(self, record: CheckRecord, seconds: dict[str, float] | None = None) -> None:
        job = self.job
        job.check_records[record.name] = record
        if record.harness_error and "out of device memory" in record.message:
            # The reference's own failure only: a failed extra set's message is the candidate's
            # exception text, which may say anything (server/failures.py). Unless the candidate's
            # processes held more than the evaluation's share then (our NVML reading): theirs.
            job.out_of_memory = not job.failures.blame_device_memory()
        if record.skipped and record.kind in job.derived_dims:
            job.facts.derived.setdefault("skipped", []).append({"name": record.name, "reason": record.message})
        job.facts.trials.append({
            "name": record.name, "seed": record.seed, "passed": record.passed, "max_abs_err": record.max_abs_err,
            "max_rel_err": record.max_rel_err, "rel_l2_err": record.rel_l2_err, "precision": record.precision,
            "message": record.message if not record.passed or record.skipped else "",
            "seconds": {k: round(v, 4) for k, v in (seconds or {}).items()}})
