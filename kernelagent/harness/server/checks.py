"""A job's supervision loop: the candidate's stages in order, each check's outputs relayed
to the trusted reference and compared there (mixed into server/job.py's Job)."""

from __future__ import annotations

import time
from typing import Any

from kernelagent.harness import protocol
from kernelagent.harness.server import draws, gate as gate_mod
from kernelagent.harness.server.verdict import CheckRecord

from kernelagent.harness.server.stages import ReferenceGone, StageTimeout, _Stop


class CheckPhases:
    """Job's supervision and correctness checks (needs Job's channels and clock)."""

    def supervise(self) -> None:
        try:
            self._supervise()
        except _Stop:
            pass
        finally:
            self.release_device_memory()

    def _supervise(self) -> None:
        assert self.ref is not None and self.cand is not None
        config = self.config
        # 1. start, load, compile: the reference gets ready while the candidate imports.
        self._await_ready_and_compiled()
        if config.compile_only:
            self.cand_recv({"done"}, self.clock() + 30)
            self.conclude([])
            return

        # 2. correctness: each check's seed revealed only when it runs. Beside other jobs, the
        # device's memory for this one is reserved first (server/gate.py MemoryLedger).
        self._reserve_device_memory()
        self.enter("correctness")
        deadline = self.clock() + self.limit("correctness")
        self.cand_send("plan",
                       reference_ops=self.ready.get("reference_ops", []) if config.defences else [])
        # Each check's seed is keyed by the secret master (server/draws.py): one says nothing of another.
        base = self.base_seed
        checks = self._plan_checks(base)
        self.planned = [c["name"] for c in checks]
        for check in checks:
            if not self.run_check(check, deadline):
                return self.end_early()

        # 3. the timed loop, clocked here.
        if config.timing and not self._timing_stages(base):
            return self.end_early()

        # 4. the end: evidence, profile, flags.
        self.finish_candidate(device_share=bool(config.defences and self.fingerprint.get("cuda")))
        self.conclude(self.claimed_flags)

    def _await_ready_and_compiled(self) -> None:
        """Stage 1: wait for the reference's `ref_ready` (its workload recorded) and the
        candidate's `compiled`, each against its own deadline; StageTimeout past either."""
        deadline_ref = self.clock() + self.limit("start") + self.limit("load")
        ref_ready = compiled = False
        deadline = self.stage_clock + self.limit(self.stage)
        while not (ref_ready and compiled):
            conns: list[Any] = []
            if not ref_ready:
                conns += [self.to_ref, self.ref_alive_fd]
            if not compiled:
                conns += [self.to_cand, self.cand_alive_fd]
            until = min(deadline if not compiled else float("inf"), deadline_ref if not ref_ready else float("inf"))
            ready = self.wait(conns, until)
            if not ready:
                raise StageTimeout()
            if not ref_ready and (self.to_ref in ready or self.ref_alive_fd in ready):
                message = self.ref_recv({"ref_ready"}, self.clock() + 1)
                self.ready = message
                ref_ready = True
                self.result["workload"] = {"input_bytes": message["input_bytes"],
                                           "output_bytes": message["output_bytes"],
                                           "param_bytes": message["param_bytes"], "flops": message["flops"],
                                           "dtype": message["output_dtype"]}
                self.result["memory"]["io_bytes"] = message["input_bytes"] + message["output_bytes"]
                self.result["memory"]["param_bytes"] = message["param_bytes"]
            if not compiled and (self.to_cand in ready or self.cand_alive_fd in ready):
                self.cand_recv({"compiled"}, self.clock() + 1, stage_deadlines=True)
                compiled = True
                self.result["compiled"] = True
            deadline = self.stage_clock + self.limit(self.stage)

    def _reserve_device_memory(self) -> None:
        """Beside other jobs, this job's share of the device's memory (from the reference's
        workload), held from here on; the wait for it recorded."""
        ready = self.ready
        need = gate_mod.job_memory_bytes(int(ready.get("input_bytes", 0)), int(ready.get("output_bytes", 0)),
                                         int(ready.get("param_bytes", 0)), self.fingerprint.get("free_bytes"))
        if getattr(self, "_memory", None) is None and self.gate_memory is not None:  # no estimate before the fork
            self.hold_device_memory(need)

    def _plan_checks(self, base: int) -> list[dict[str, Any]]:
        """The correctness checks in order (trials, the alternative inputs, the extra input sets
        the reference planned), each with its seed; the derived sets not checked are dropped or
        recorded as skipped. ReferenceGone when the reference plans a set that does not exist."""
        config = self.config
        checks = [{"name": f"trial {i}", "kind": "main", "seed": draws.check_seed(base, f"trial {i}"), "stop": True}
                  for i in range(config.trials)]
        if self.ready.get("alt"):
            checks.append({"name": "signed-normal inputs", "kind": "alt", "seed": draws.check_seed(base, "alt"),
                           "stop": True})
        if self.ready.get("near_one"):
            checks.append({"name": "inputs near one", "kind": "near-one", "seed": draws.check_seed(base, "near-one"),
                           "stop": True})
        derived_names = {d["kind"]: d["name"] for d in self.result["derived"].get("sets", [])}
        for kind, why in self.ready.get("extra_skipped", {}).items():
            self.result["derived"].setdefault("skipped", []).append(
                {"name": derived_names.get(kind, kind), "reason": f"skipped: {why}"[:600]})
        n_extra = int(self.ready.get("n_extra", 0))
        extra_plan = list(self.ready.get("extra_plan", range(n_extra)))
        if "sets" in self.result["derived"]:  # the derived sets checked (spares the reference left out dropped)
            self.result["derived"]["sets"] = [d for d in self.result["derived"]["sets"]
                                              if int(d["kind"].split(":")[1]) in extra_plan]
        for j in extra_plan:
            if not isinstance(j, int) or not 0 <= j < n_extra:
                raise ReferenceGone(f"planned an extra input set that does not exist ({j!r})")
            checks.append({"name": derived_names.get(f"extra:{j}", f"extra input set {j}"), "kind": f"extra:{j}",
                           "seed": draws.check_seed(base, f"extra:{j}"), "stop": False})
        return checks

    def _timing_stages(self, base: int) -> bool:
        """Stage 3: the timed loop, then (when asked) the post-timing check. True to go on."""
        config = self.config
        self.enter("timing")
        # The checks passed: if no early evidence session could start beside them (the
        # server's cap on live ones), one may start now, beside the timed loop's wait.
        from kernelagent.harness.server import evidence

        evidence.start_early(self)
        if not self.timed_loop(self.clock() + self.limit("timing")):
            return False
        if config.post_timing_check:
            self.enter("post-check")
            post = {"name": "post-timing check", "kind": "main", "seed": draws.check_seed(base, "post-timing"),
                    "stop": True}
            self.planned.append(post["name"])
            if not self.run_check(post, self.clock() + self.limit("post-check")):
                return False
        return True

    def run_check(self, check: dict[str, Any], deadline: float) -> bool:
        """One check: the candidate runs it, the reference compares. True to go on."""
        # A derived set's shapes reach the candidate's process with its own check, never before.
        overrides = self.derived_overrides[int(check["kind"].split(":")[1])] \
            if check["kind"].startswith("extra:") and self.derived_overrides else None
        self.cand_send("run_check", name=check["name"], kind=check["kind"], seed=check["seed"], overrides=overrides)
        self.trace_checks = getattr(self, "trace_checks", 0) + 1  # one CHECK marker pair each (trace_stage)
        sent = time.perf_counter()
        message = self.cand_recv({"outputs"}, deadline)
        if check["kind"] == "main":
            # The server's own clock on one call (input generation and the hand-over included):
            # an upper bound of the call's time, from which the timed loop is sized.
            self.call_latency_ms.append((time.perf_counter() - sent) * 1e3)
        if message["name"] != check["name"]:
            raise protocol.ProtocolError(f"outputs for {message['name'][:40]!r} when {check['name']!r} was asked")
        error = message["error"]
        if error is not None and (not check["kind"].startswith("extra:") or message["outputs"] or message["inputs"]):
            # Only an extra input set may be answered with the exception it raised (then it is
            # compared as a failure, unless the reference cannot run that set either).
            raise protocol.ProtocolError(f"an error instead of outputs for {check['name']!r}")
        payloads = self.relay_payloads(message["outputs"] + message["inputs"], deadline,
                                       self.payload_limit(check["kind"].startswith("extra:"), check["kind"]))
        record = self.compare(check, message["n_outputs"], message["outputs"], message["inputs"], payloads, deadline,
                              candidate_error=error[:4000] if error is not None else None)
        stop = not record.passed and check["stop"]
        self.cand_send("check_reply", decided=stop, passed=record.passed, stop=stop)
        return not stop

    def compare(self, check: dict[str, Any], n_outputs: int, outputs: list[Any], inputs: list[Any],
                payloads: list[bytes], deadline: float, candidate_error: str | None = None,
                keep_cache: bool = False) -> CheckRecord:
        """The reference's verdict on one check; it gives its cached device memory back after the
        check unless `keep_cache` (between the timed loop's segments)."""
        protocol.send(self.to_ref, "check", self.job_id, self.ref_nonce, name=check["name"], kind=check["kind"],
                      seed=check["seed"], n_outputs=n_outputs, outputs=outputs, inputs=inputs,
                      stop_on_failure=bool(check.get("stop", True)), candidate_error=candidate_error,
                      keep_cache=keep_cache)
        for data in payloads:
            protocol.send_payload(self.to_ref, data)
        record = CheckRecord.from_message(self.ref_recv({"verdict"}, deadline))
        self.record_check(record)
        return record

    def record_check(self, record: CheckRecord) -> None:
        self.checks[record.name] = record
        if record.harness_error and "out of device memory" in record.message:
            # The reference's own failure only: a failed extra set's message is the candidate's
            # exception text, which may say anything (server/failures.py). Unless the candidate's
            # processes held more than the evaluation's share then (our NVML reading): theirs.
            self.out_of_memory = not self.blame_device_memory()
        if record.skipped and record.kind in self.derived_dims:
            self.result["derived"].setdefault("skipped", []).append({"name": record.name, "reason": record.message})
        self.result["trials"].append({
            "name": record.name, "seed": record.seed, "passed": record.passed, "max_abs_err": record.max_abs_err,
            "max_rel_err": record.max_rel_err, "rel_l2_err": record.rel_l2_err, "precision": record.precision,
            "message": record.message if not record.passed or record.skipped else ""})
