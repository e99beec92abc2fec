"""One evaluation, supervised by the harness server.

The server forks two processes per job (child/): the trusted reference process and the
candidate's process, which enters its own namespaces (jail/candidate.py) before any candidate code
runs. Each holds exactly one channel: a pipe to the server. The server drives both, one step at
a time, and relays what the candidate sends to the reference, so:

- every message from the candidate's process is checked against what the server asked for at
  that point (a `done` before the plan, a second `timing`, an `outputs` for a check that was not
  asked are protocol violations: `rejected: protocol`);
- check seeds are drawn by the server with os.urandom after the fork, and each is revealed to
  the candidate only when that check runs;
- the timed loop is clocked by the server from the outside, against a calibration loop the
  reference process runs with an empty model, and a secret subset of the timed calls' outputs is
  compared in the reference process (server/verdict.py decides from these);
- the verdict comes from server/verdict.py, over the reference's comparisons only, and the
  result's status from the fold of what the job recorded (harness/verdict.py, `record`).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import secrets
import shutil
import threading
import time
import traceback
import uuid
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelagent.harness import protocol
from kernelagent.harness.config import EvalConfig
from kernelagent.harness import verdict as fold
from kernelagent.harness.result import Status
from kernelagent.harness.server import draws, evidence, gate as gate_mod, trace_stage, verdict
from kernelagent.harness.server.gate import Gate
from kernelagent.harness.server.baselines import Baselines
from kernelagent.harness.server.channels import Channels
from kernelagent.harness.server.checks import Checks
from kernelagent.harness.server.failures import Failures
from kernelagent.harness.server.load import Load
from kernelagent.harness.server.processes import (LOG_TAIL_BYTES, kill_group, log_tail, log_tail_fd, namespace_members,
                                                  start_stacks, tree_cpu_s, tree_states)
from kernelagent.harness.server.stages import CandidateGone, ReferenceGone, StageTimeout, Stop
from kernelagent.harness.server.job_record import JobRecord
from kernelagent.harness.server.memory import Memory
from kernelagent.harness.server.start import Start
from kernelagent.harness.server.timed import SLOT_MIN_S, TimedLoop
from kernelagent.harness.server.verdict import CheckRecord
from kernelagent import hardware

if TYPE_CHECKING:
    from kernelagent.harness.trace import channel as trace_channel




# PyTorch's and CUDA's words for an allocation that failed, read only from the reference's log: our trusted process.
_OOM_WORDS = ("CUDA error: out of memory", "CUDA out of memory", "torch.OutOfMemoryError",
              "torch.cuda.OutOfMemoryError") + hardware.ALLOC_FAILED_WORDS


# Other jobs' memory on the device, by our ledger, above which a candidate's out-of-memory error
# is re-run alone before it counts (a context and a small problem: below it, no neighbour crowded it).
MEMORY_BESIDE_MIN = 1 << 30


def _says_out_of_memory(log: str) -> bool:
    return any(word in log for word in _OOM_WORDS)


class Job:
    """Runs one evaluation and produces the fields of an EvalResult: its JobRecord, `facts`
    (server/job_record.py). Its stages are objects it holds (start, channels, load, checks, timed,
    baselines, memory, failures), each built with the job and reaching it through its Protocol in
    server/seams.py."""

    # set by the start's stage (server/start.py) and run(), read by the stages (server/seams.py)
    scratch: Path
    refdir: Path
    child_job: dict[str, Any]
    problem_source: str
    to_ref: Connection
    to_cand: Connection
    ref_alive_fd: int
    cand_alive_fd: int
    cand_log_fd: int | None
    base_seed: int
    started: float
    started_epoch: float
    thread_cpu0: float
    smoke: bool
    static_flags: dict[str, bool]
    compile_seed: int
    claimed_flags: list[dict[str, str]]

    def __init__(self, request: dict[str, Any], scratch_root: Path, fingerprint: dict[str, Any],
                 jail: dict[str, Any], gate: Gate | None = None):
        self.request = request
        # The device's timing slot, shared by the server's concurrent jobs (server/gate.py); a
        # job on its own gets a gate of its own.
        self.gate = gate if gate is not None else Gate()
        self.gate_memory: gate_mod.MemoryLedger | None = getattr(self.gate, "memory", None)
        self._pause_lock = threading.Lock()
        self._paused_depth = 0
        self._paused_since = 0.0
        self._paused_s = 0.0
        self.concurrency: dict[str, Any] = {}
        # What the gate stopped of the candidate's and the reference's processes (gate.Stops).
        self.cand_stops, self.ref_stops = gate_mod.Stops(), gate_mod.Stops()
        self.job_id = request["job"]
        # A problem's baselines, a job of their own (protocol `evaluate_baselines`): the reference's
        # process only, started as soon as the caller knows the problem (run_baselines_only).
        self.baselines_only = request.get("type") == "evaluate_baselines"
        self.config = EvalConfig.from_dict(request["config"])
        self.fingerprint = fingerprint
        self.jail = jail
        self.root = scratch_root / f"job-{uuid.uuid4().hex[:12]}"
        self.rng = random.SystemRandom()
        # status, reason, stage and correct: written only by the verdict fold (record)
        self.outcomes: list[fold.Outcome] = []
        self.facts = JobRecord()  # what the result says (server/job_record.py); its verdict the fold's
        self.check_records: dict[str, CheckRecord] = {}
        self.planned: list[str] = []
        self.stage = "start"
        self.stage_started = time.monotonic()
        self.stage_clock = self.clock()
        self.ready: dict[str, Any] = {}
        self.ref: mp.Process | None = None
        self.cand: mp.Process | None = None
        self.ref_nonce = ""
        self.call_latency_ms: list[float] = []
        self.derived_dims: dict[str, tuple[str, str]] = {}  # extra:<j> -> (its dims, the main's)
        self.derived_overrides: list[dict[str, Any]] = []  # each derived set's, drawn in run()
        self.hold: gate_mod.Hold | None = None
        self.early_evidence: Any = None  # the evidence's session, started beside the checks (evidence.py)
        self.early_counted = False  # that session counts as live in gate.profilers
        self.trace_channel: trace_channel.Channel | None = None  # the candidate's trace (trace_stage.open_for)
        self.ref_trace_channel: trace_channel.Channel | None = None  # the reference's (its baselines' clock)
        self.trace: trace_channel.TraceBytes | None = None  # its bytes, once collected
        self.trace_checks = 0  # the checks the trace's rules are told of
        self.stage_reports = 0  # the candidate's progress messages: bounded (MAX_STAGE_REPORTS)
        self.cpu: dict[str, float] = {}  # host CPU seconds by part (finish_result)
        self.alone = bool((request.get("options") or {}).get("alone"))
        self.out_of_memory = False  # an out-of-memory error was seen (retried alone when it ran beside others)
        self.stage_timed_out = False  # a stage ran past its limit (retried alone when it ran beside others)
        self.alloc_retries: dict[str, int] = {}  # the allocator gave memory back while timed work ran (per process)
        # The stages, each with this job through its Protocol (server/seams.py).
        self.start = Start(self)
        self.channels = Channels(self)
        self.failures = Failures(self)
        self.memory = Memory(self)
        self.load = Load(self)
        self.checks = Checks(self)
        self.timed = TimedLoop(self)
        self.baselines = Baselines(self)

    # -- helpers -------------------------------------------------------------------
    def record(self, outcome: fold.Outcome) -> fold.Verdict:
        """What happened, in order; the result's verdict is their fold (harness/verdict.py)."""
        self.outcomes.append(outcome)
        return fold.apply_to(self.facts, self.outcomes)

    def fail(self, status: str, reason: str, stage: str | None) -> None:
        self.record(fold.Failed(status, reason, stage))  # the first failure decides

    def flag(self, item: dict[str, str]) -> None:
        self.facts.flags.append(item)

    def enter(self, name: str) -> None:
        now = time.monotonic()
        seconds = self.facts.stage_seconds
        seconds[self.stage] = seconds.get(self.stage, 0.0) + now - self.stage_started
        self.stage, self.stage_started, self.stage_clock = name, now, self.clock()

    # -- the job's clock: stage deadlines run on it -----------------------------------------
    def clock(self) -> float:
        """Monotonic seconds, less the time this job spent waiting for the device's timing slot
        or stopped while a neighbour timed (server/gate.py): a job is never timed out for the
        time others held the device."""
        with self._pause_lock:
            paused = self._paused_s + (time.monotonic() - self._paused_since if self._paused_depth else 0.0)
        return time.monotonic() - paused

    def pause_clock(self, paused: bool) -> None:
        with self._pause_lock:
            if paused:
                if self._paused_depth == 0:
                    self._paused_since = time.monotonic()
                self._paused_depth += 1
            elif self._paused_depth:
                self._paused_depth -= 1
                if self._paused_depth == 0:
                    self._paused_s += time.monotonic() - self._paused_since

    def wait(self, conns: list[Any], deadline: float) -> list[Any]:
        """multiprocessing.connection.wait until `deadline` on the job's clock ([] then)."""
        while True:
            remaining = deadline - self.clock()
            if remaining <= 0:
                return []
            ready = wait(conns, timeout=min(remaining, 0.5))
            if ready:
                return ready

    def freeze_candidate(self, stop: bool) -> None:
        if self.cand is not None:
            self.stop_candidate(stop)

    def freeze(self, stop: bool) -> None:
        """Stop (or continue) every process of this job, for a neighbour's timed loop."""
        if self.cand is not None:
            self.stop_candidate(stop)
        if self.ref is not None:
            self.ref_stops.signal(self.ref, stop)

    def stop_candidate(self, stop: bool) -> bool:
        """SIGSTOP (or SIGCONT) every process of the candidate's job: its process group and
        process tree (gate.signal_processes: ninja's nvcc commands have groups of their own)
        and, in a jail, every process of its pid namespace (a setsid helper included). A
        continue lets go of every process the earlier stops reached (gate.Stops)."""
        assert self.cand is not None
        self.cand_stops.signal(self.cand, stop, lambda: namespace_members(self.cand.pid))
        return True

    def idle_probe(self) -> tuple[bool, bool]:
        """The trusted reference process's reading: is the device idle (no other context's
        kernels stretching a tiny spin), and is its memory bandwidth quiet (gate.Bandwidth: no
        memory being cleared by the driver)? Bounded in wall time: the holder's clock is paused."""
        protocol.send(self.to_ref, "idle_probe", self.job_id, self.ref_nonce)
        if not wait([self.to_ref, self.ref_alive_fd], timeout=30):
            raise ReferenceGone("did not answer the device idle probe within 30 s")
        message = self.channels.ref_recv({"idle"}, self.clock() + 1)
        self.concurrency["probe_us"] = max(float(self.concurrency.get("probe_us", 0.0)), float(message["us"]))
        self.concurrency["probes"] = int(self.concurrency.get("probes", 0)) + 1
        copy_us = message["copy_us"]
        if copy_us is not None:
            self.concurrency["copy_us"] = max(float(self.concurrency.get("copy_us", 0.0)), float(copy_us))
        return bool(message["idle"]), self.gate.bandwidth.quiet(copy_us)

    def left_stopped(self) -> list[str]:
        """Processes of this job that the gate stopped and has not let go, while nobody holds
        the device's slot: 'pid comm' each. Only the harness's own stops count: a candidate that
        stops itself is not the harness's fault."""
        if self.gate.holder() is not None:
            return []
        return self.cand_stops.still_stopped() + self.ref_stops.still_stopped()

    def limit(self, name: str) -> float:
        return self.config.timeouts.limit(name, self.config.backend)

    # -- the run ---------------------------------------------------------------------
    def abandon(self) -> None:
        """The job will not run (its nonce never came): its processes go, nothing is reported."""
        trace_stage.close(self)
        evidence.discard(self)
        self.gate.unregister(self)
        for proc in (self.cand, self.ref):
            kill_group(proc)
            if proc is not None:
                proc.join(5)
        for conn in (getattr(self, "to_ref", None), getattr(self, "to_cand", None)):
            if conn is not None:
                conn.close()
        if getattr(self, "cand_log_fd", None) is not None:
            os.close(self.cand_log_fd)
            self.cand_log_fd = None
        shutil.rmtree(self.root, ignore_errors=True)

    def derive_check_sets(self) -> list[dict[str, Any]]:
        """Derived check sets (server/draws.py) for a problem without get_extra_inputs(), drawn
        from the evaluation's secret master seed: their overrides, for the reference now and for
        the candidate's process with each set's check."""
        if not (self.config.extra_inputs and self.config.derived_checks > 0) or self.static_flags["has_extra"] \
                or self.smoke:
            return []
        drawn = draws.derived_sets(self.problem_source, self.config.derived_checks + 2, self.base_seed)
        if "note" in drawn:
            self.facts.derived["sets_note"] = drawn["note"]
            return []
        self.derived_dims = drawn["dims"]
        self.facts.derived.update(sets=drawn["sets"], skipped=[])
        return drawn["overrides"]

    def run(self) -> JobRecord:
        if self.facts.status == Status.TOO_LARGE:  # decided at the start (server/start.py); nothing was started
            return self.facts
        if self.baselines_only:
            return self.run_baselines_only()
        if self.config.backend == "cuda" and not self.fingerprint.get("cuda"):
            return self.precompile_only()
        # Secrets, drawn now that the candidate's process exists without them.
        self.ref_nonce = secrets.token_hex(16)
        # The master of every check's seed and of the derived shapes (server/draws.py).
        self.base_seed = self.config.seed if self.config.seed is not None else draws.draw_master(self.rng)
        self.facts.seeds = {"base": self.base_seed, "secret": self.config.seed is None,
                                "trials": [draws.check_seed(self.base_seed, f"trial {i}")
                                           for i in range(self.config.trials)],
                                "weights": self.config.weight_seed, "compile": self.compile_seed}
        try:
            derived = self.derived_overrides = self.derive_check_sets()
            protocol.send(self.to_ref, "ref_nonce", self.job_id, nonce=self.ref_nonce, derived=derived)
            evidence.start_early(self)  # its set-up runs beside the checks (server/evidence.py)
            self.checks.supervise()
        except StageTimeout:
            if self.stage == "timing" and self.timed.slot_limited:
                limited = self.timed.slot_limited
                self.fail(Status.TIMEOUT, f"the timed loop held the device for more than {limited:.0f} s "
                                          "(50x the reference's time per call, at least "
                                          f"{SLOT_MIN_S:.0f} s) while other evaluations waited for it; the "
                                          "candidate's processes were killed. Work the candidate queues "
                                          "outside its calls (threads, other streams) counts here", self.stage)
            elif left := self.left_stopped():
                # A process of this job still stopped by the gate, with no neighbour timing: the
                # harness's fault (it never let go), never the candidate's timeout.
                self.fail(Status.HARNESS_ERROR, f"stage '{self.stage}' ran past its {self.limit(self.stage):.0f} s "
                                                "limit while processes of this job were left stopped by the harness "
                                                f"({', '.join(left)[:300]})", self.stage)
            else:
                self.stage_timed_out = True  # beside other jobs, re-run alone first (conclude_concurrency)
                self.fail(Status.TIMEOUT, f"stage '{self.stage}' ran past its {self.limit(self.stage):.0f} s limit; "
                                          "the candidate's processes were killed", self.stage)
                # What each process was doing then (pid, name, state, kernel wait): without it a
                # hang beside other jobs says only that it ran out of time (processes.tree_states).
                self.concurrency["at_limit"] = {
                    "candidate": tree_states(self.cand.pid if self.cand is not None else None),
                    "reference": tree_states(self.ref.pid if self.ref is not None else None)}
                if self.stage == "start":  # our code only so far: where its Python stack was
                    self.concurrency["at_limit"]["candidate_stack"] = start_stacks(
                        getattr(self, "cand_log_fd", None))
        except CandidateGone:
            self.failures.cand_died()
        except ReferenceGone as exc:
            # Our own process died: out of memory if it said so (its message, or CUDA's own words in
            # its log, e.g. creating its context beside other jobs' memory on an H100 run).
            said = "out of device memory" in str(exc) or _says_out_of_memory(log_tail(self.refdir / "reference.log"))
            self.failures.keep_first_failure(f"the reference process {exc}")  # a failed check stays the verdict
            if said and not self.out_of_memory:  # unless the candidate held more than its share then
                self.out_of_memory = not self.failures.blame_device_memory()
            self.fail(Status.HARNESS_ERROR, f"the reference process {exc} during stage '{self.stage}'", self.stage)
        except protocol.ProtocolError as exc:
            self.failures.candidate_protocol(str(exc))
        except Exception:  # noqa: BLE001 - a bug of ours must not take the server down
            self.failures.keep_first_failure("harness error: " + traceback.format_exc(limit=4))
            self.fail(Status.HARNESS_ERROR, "harness error:\n" + traceback.format_exc(limit=4), None)
        finally:
            self.cpu["candidate"] = tree_cpu_s(self.cand.pid if self.cand is not None else None)
            with self.gate.between_holds(self):  # its memory cleared while nobody times (gate.py)
                kill_group(self.cand)
                if self.cand is not None:
                    self.cand.join(5)
            trace_stage.collect(self)
        self.finish_result()
        return self.facts

    def run_baselines_only(self) -> JobRecord:
        """A problem's baselines without a candidate: the reference loads the problem (`ref_ready`),
        then compiles its runners beside other jobs and times them holding the device's slot
        (Baselines.run_baselines). The result carries `baselines` (a failure in their `errors`),
        never a verdict about a candidate; the caller stores them for every evaluation of the problem."""
        self.ref_nonce = secrets.token_hex(16)
        self.base_seed = self.config.seed if self.config.seed is not None else draws.draw_master(self.rng)
        try:
            protocol.send(self.to_ref, "ref_nonce", self.job_id, nonce=self.ref_nonce, derived=[])
            self.enter("load")
            self.ready = self.channels.ref_recv({"ref_ready"}, self.clock() + self.limit("start") + self.limit("load"))
            self.enter("finished")  # the baselines keep their own clock (stage_seconds["baselines"])
            self.baselines.run_baselines()
        except StageTimeout:
            self.facts.baselines = {"errors": {"reference": f"the reference did not load the problem within its "
                                                            f"{self.limit('start') + self.limit('load'):.0f} s"}}
        except Stop:  # the reference said why (channels.ref_error: a broken or too large problem)
            self.facts.baselines = {"errors": {"reference": (self.facts.reason or "the reference failed")[:2000]}}
        except (ReferenceGone, OSError) as exc:
            self.facts.baselines = {"errors": {"reference": f"the reference process {exc}"}}
        except Exception:  # noqa: BLE001 - a bug of ours must not take the server down
            self.facts.baselines = {"errors": {"harness": traceback.format_exc(limit=3)}}
        finally:
            trace_stage.collect(self)
        self.finish_result()
        return self.facts

    def finish_result(self) -> None:
        if self.facts.status == Status.CORRECT and self.request.get("want_baselines"):
            try:
                self.baselines.run_baselines()
            except Exception:  # noqa: BLE001
                self.facts.baselines = {"errors": {"harness": traceback.format_exc(limit=3)}}
        self.publish_build()
        evidence.stage(self)  # before the reference ends: the slot's idle probe runs there
        self.memory.reference_stats()
        self.shared_device = self.gate.unregister(self)
        self.cpu["reference"] = tree_cpu_s(self.ref.pid if self.ref is not None else None)
        with self.gate.between_holds(self):
            kill_group(self.ref)
            if self.ref is not None:
                self.ref.join(5)
        trace_stage.close_reference(self)
        self.conclude_concurrency()
        self.to_ref.close()
        self.to_cand.close()
        for fd in (getattr(self, "ref_alive_fd", None), getattr(self, "cand_alive_fd", None)):
            if fd is not None:
                os.close(fd)
        log_fd = getattr(self, "cand_log_fd", None)
        if log_fd is not None:
            self.facts.log = log_tail_fd(log_fd)
            os.close(log_fd)
            self.cand_log_fd = None
        ref_log = log_tail(self.refdir / "reference.log")
        if self.facts.status in (Status.BAD_PROBLEM, Status.HARNESS_ERROR) and ref_log.strip():
            self.facts.log = (self.facts.log or "") + "\n--- reference process ---\n" + ref_log
        self.facts.stage_seconds["total_server"] = time.monotonic() - self.started
        # Host CPU this job's own processes used (tree_cpu_s), its evidence session's, and the
        # server's thread for it: what one evaluation costs the host, neighbours apart.
        if hasattr(self, "thread_cpu0"):
            self.cpu["server"] = time.thread_time() - self.thread_cpu0
        cpu = {k: round(v, 3) for k, v in self.cpu.items()}
        self.facts.stage_seconds.update({f"cpu_{k}": v for k, v in cpu.items()})
        self.facts.stage_seconds["cpu_job"] = round(sum(cpu.values()), 3)
        shutil.rmtree(self.root, ignore_errors=True)

    def publish_build(self) -> None:
        """A CUDA candidate's builds go to the cache (the evidence's ncu run stages them from there)."""
        options = self.request.get("options", {})
        if self.config.backend == "cuda" and options.get("cuda_cache_dir"):
            try:  # the candidate's processes are dead: nothing of theirs can race this copy
                from kernelagent.harness.server import build_cache

                build_cache.publish(self.scratch, options["cuda_cache_dir"], self.request.get("candidate_sha256", ""))
            except Exception:  # noqa: BLE001 - the cache is an optimisation
                traceback.print_exc()

    def conclude_concurrency(self) -> None:
        """What running beside other jobs cost this one (result.concurrency), and the rules for what
        neighbours can cause: an out-of-memory error, a stage past its limit, or a full device
        while timed work ran, in a job that shared the device, is a harness error the caller
        re-runs alone (caller/evaluator.py), never the candidate's; alone, it is the candidate's
        as before."""
        shared = bool(getattr(self, "shared_device", False))
        self.concurrency.update(shared_device=shared, alone=self.alone,
                                span=[round(getattr(self, "started_epoch", time.time()), 4), round(time.time(), 4)])
        retries = {k: v for k, v in self.alloc_retries.items() if v}
        if retries:
            self.concurrency["alloc_retries"] = retries
        beside = shared and not self.alone
        if beside and self.stage_timed_out and self.facts.status == Status.TIMEOUT:
            # Beside other jobs the host's CPUs are shared, and a stage's clock is paused only while
            # a neighbour holds the device, so cold jobs' compiles beside each other can run honest
            # candidates past their 'start' or 'compile' limits (docs/concepts/concurrency.md,
            # "Inductor's compile workers"). A stage limit is the candidate's only once it is
            # reached alone.
            self.retry_alone("ran past a stage limit while other evaluations shared the host; it is re-run alone "
                             "before anything is said about the candidate (was: "
                             + self.facts.reason[:300] + ")")
        timed = self.facts.status == Status.CORRECT or (getattr(self, "baselines_only", False)
                                                        and bool((self.facts.baselines or {}).get("timings")))
        if beside and retries and timed:
            # The device was full while the candidate's loop or profile, or a baseline, was timed:
            # the caching allocator gave memory back and mapped fresh pages call after call, so the
            # times are the neighbours' memory's as much as the kernel's (common.AllocPressure). A
            # candidate that claims this only buys itself a run alone.
            self.retry_alone("the device's memory was full while this evaluation was timed beside others "
                             f"(allocator retries: {retries}); it is re-run alone before its times count")
        # Out of memory beside others: the reference saw it (ours), or the candidate's process said so
        # while our ledger had memory promised to other jobs (ours too: failures.note_memory_beside).
        crowded = self.out_of_memory or self.concurrency.get("memory_beside_bytes", 0) >= MEMORY_BESIDE_MIN
        if beside and crowded and self.facts.status in (Status.RUNTIME_ERROR, Status.HARNESS_ERROR,
                                                           Status.CRASHED, Status.TOO_LARGE):
            self.retry_alone("out of device memory while other evaluations shared the device; it is re-run "
                             "alone before anything is said about the candidate (was: "
                             + self.facts.reason[:300] + ")")
        self.facts.concurrency = gate_mod.describe(self.concurrency)

    def retry_alone(self, reason: str) -> None:
        """A harness error that the caller answers by running the job again alone
        (caller/evaluator.py), where this job shared the device (conclude_concurrency)."""
        self.record(fold.RetryAlone(reason))
        self.concurrency["retry_alone"] = True

    def precompile_only(self) -> JobRecord:
        """A CUDA candidate without a GPU: compile its sources with nvcc; nothing runs.
        Compiled is all that can be said here."""
        from kernelagent.harness.server.precompile import precompile

        result = precompile(self.request["candidate_source"], self.scratch / "precompile",
                            timeout=self.config.timeouts.cuda_build, jail=self.jail)
        self.facts.stage_seconds["nvcc"] = result.seconds
        outcome = self.record(result.verdict())
        self.facts.compiled = outcome.status == Status.COMPILED
        self.facts.flags += result.flags()
        self.facts.log = "\n".join(result.commands)[-LOG_TAIL_BYTES:]
        self.facts.stage_seconds["total_server"] = time.monotonic() - self.started
        shutil.rmtree(self.root, ignore_errors=True)
        return self.facts

    # -- supervision -----------------------------------------------------------------------
    def finish_candidate(self, device_share: bool) -> None:
        # The device share is judged from outside when the kernel evidence runs (its ncu session
        # sees every kernel): the candidate's process then does not profile itself for it.
        device_share = device_share and not evidence.covers_device_share(self)
        self.enter("profile" if (self.config.profile or device_share) else "finishing")
        # Asked-for profiling is a second clock on the candidate's kernels (profiling.clocks sets
        # it against the timed loop's median): it holds the device's slot as the loop does, since
        # beside a neighbour's checks the profiler reads slower than the timed loop
        # (docs/concepts/concurrency.md, "Measurements behind the code").
        profiled = bool(self.config.profile)
        with contextlib.ExitStack() as stack:
            if (profiled or device_share) and self.fingerprint.get("cuda"):
                # torch.profiler in the candidate's process never beside an ncu session (profilers.py)
                if not stack.enter_context(self.gate.profilers.in_process(self, self.limit("profile"))):
                    self.flag(verdict.flag("profile", "the candidate's in-process profile was skipped: Nsight "
                                                      "Compute sessions of other evaluations held the device's "
                                                      "profiler past the stage's limit", "info"))
                    profiled = device_share = False
            self._finish_candidate(profiled, device_share)

    def _finish_candidate(self, profiled: bool, device_share: bool) -> None:
        with self.gate.hold(self, self.idle_probe, self.concurrency.setdefault("profile_slot", {})) \
                if profiled else contextlib.nullcontext():
            self.channels.cand_send("finish", profile=profiled, device_share=device_share)
            deadline = self.clock() + self.limit("profile")
            message = self.channels.cand_recv({"kernels", "done"}, deadline)
            if message["type"] == "kernels":
                with self.failures.handling_candidate("profiler rows"):
                    self.facts.kernels = verdict.trusted_kernel_rows(message["kernels"])
                message = self.channels.cand_recv({"done"}, deadline)
        with self.failures.handling_candidate("final report"):
            self.claimed_flags = verdict.trusted_flags(message["flags"])
            peak = message["memory"].get("peak_bytes")
            if isinstance(peak, int) and not isinstance(peak, bool):
                self.facts.memory["peak_candidate_bytes"] = peak
            self.alloc_retries["candidate"] = verdict.count_claim(message["memory"].get("alloc_retries"))

    def end_early(self) -> None:
        """A check failed and stops the evaluation: collect the candidate's evidence, conclude."""
        try:
            self.finish_candidate(device_share=False)
        except (StageTimeout, CandidateGone, protocol.ProtocolError, Stop):
            self.claimed_flags = []
        self.conclude(self.claimed_flags)

    def conclude(self, claimed: list[dict[str, str]]) -> None:
        self.enter("finished")
        outcome = verdict.conclude_checks(self.planned, self.check_records, self.config.compile_only,
                                          bool(self.facts.compiled), derived=self.derived_dims)
        flags = list(self.facts.flags) + list(outcome.flags) + list(claimed)
        # decides only where nothing failed before; its reject flags outrank the comparison
        self.record(fold.Concluded(outcome.status, outcome.reason, outcome.stage, tuple(flags)))
        self.facts.flags = flags
