"""One evaluation, supervised by the harness server.

The server forks two processes per job (child/): the trusted reference process and the
candidate's process, which enters its own namespaces (child/jail.py) before any candidate code
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
- the verdict comes from server/verdict.py, over the reference's comparisons only.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import multiprocessing as mp
import os
import random
import secrets
import shutil
import signal
import threading
import time
import traceback
import uuid
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from kernelagent.harness import protocol
from kernelagent.harness.child.inputs import SEED_ALT, SEED_EXTRA, SEED_POST_TIMING, SEED_TIMING
from kernelagent.harness.config import EvalConfig
from kernelagent.harness.result import Status
from kernelagent.harness.server import gate as gate_mod, verdict
from kernelagent.harness.server.gate import Gate
from kernelagent.harness.server.verdict import CheckRecord

FORK = mp.get_context("fork")
LOG_TAIL_BYTES = 6000
# Outputs of timed calls kept for verification: at most this many calls, within this share of
# free device memory (or this many bytes on the CPU).
MAX_KEPT_CALLS = 1000
KEEP_DEVICE_SHARE = 0.3
KEEP_CPU_BYTES = 256 << 20
TIMED_CHECKS = 3  # timed calls verified, chosen in secret over the whole loop (the last one always too)
MAX_SEGMENTS = 256  # a loop of huge outputs (one kept per segment) stops here
# The server reads the SM clock around the candidate's loop only where NVML starts faster than
# this (measured by the device probe): it opens and closes NVML around each loop.
NVML_INIT_MAX_MS = 200.0
# The least time a timed loop may hold the device's slot beside other jobs (see _timed_loop).
SLOT_MIN_S = 15.0
SLOT_SEGMENT_S = 5.0

_START_STAGES = ("start", "load", "compile")


class StageTimeout(Exception):
    pass


class CandidateGone(Exception):
    pass


class ReferenceGone(Exception):
    pass


def _static_flags(problem_source: str) -> dict[str, bool]:
    tree = ast.parse(problem_source)
    names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    return {"has_smoke": "get_smoke_inputs" in names, "has_extra": "get_extra_inputs" in names}


def _plan_cpu_inputs(source: str, workdir: Path, timeout: float) -> dict[str, Any]:
    """derive.plan_cpu_inputs in a short-lived forked process (it runs problem code: never in
    the server itself), bounded by `timeout`; {"error": ...} when it fails or runs out of time."""
    import json

    parent_end, child_end = FORK.Pipe(duplex=False)

    def target() -> None:
        try:
            from kernelagent.harness import derive
            from kernelagent.harness.child.namespaces import close_inherited_fds

            close_inherited_fds([child_end.fileno(), 0, 1, 2])
            os.chdir(workdir)
            plan = derive.plan_cpu_inputs(source, available_bytes=derive.available_memory())
        except BaseException as exc:  # noqa: BLE001 - reported to the server
            plan = {"error": "".join(traceback.format_exception_only(type(exc), exc)).strip()[:1000]}
        child_end.send_bytes(json.dumps(protocol.json_safe(plan)).encode())
        os._exit(0)

    proc = FORK.Process(target=target, name="kernelagent-derive")
    proc.start()
    child_end.close()
    try:
        if parent_end.poll(timeout):
            plan = json.loads(parent_end.recv_bytes(1 << 20))
        else:
            plan = {"error": f"deriving smoke sizes took more than {timeout:.0f} s"}
    except (EOFError, OSError, ValueError):
        plan = {"error": "the process deriving smoke sizes died"}
    finally:
        _kill_group(proc)
        proc.join(5)
        parent_end.close()
    return plan


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / (1 << 30):.1f} GiB"


def _kill_group(proc: mp.Process | None) -> None:
    if proc is None or proc.pid is None:
        return
    for target in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: os.kill(proc.pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError, OSError):
            pass


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        detail = {"SIGSEGV": " (segmentation fault)", "SIGABRT": " (abort)", "SIGKILL": " (killed)",
                  "SIGBUS": " (bus error)", "SIGFPE": " (arithmetic error)"}.get(name, "")
        return f"was killed by {name}{detail}"
    if code >= 128 and code - 128 in {s.value for s in signal.Signals}:
        return _describe_exit(-(code - 128))  # pid 1 of a jail reports a signal as 128+n
    return f"exited with code {code} (os._exit / sys.exit in candidate code?)"


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
        return ("... [earlier output cut] ...\n" if size > LOG_TAIL_BYTES else "") + text
    except OSError:
        return ""


def _candidate_process(job: dict[str, Any], conn: Connection, workdir: Path, jail: dict[str, Any]) -> None:
    """The candidate's process, first thing after the fork: the jail (namespaces, every other
    descriptor closed), then the log, then the candidate."""
    from kernelagent.harness.child import candidate_side, jail as jail_mod
    from kernelagent.harness.child.common import child_setup

    log_path = workdir / "candidate.log"
    try:
        jail_mod.enter(workdir, jail, keep_fds=[conn.fileno()], log_path=log_path)
    except BaseException as exc:  # noqa: BLE001 - never run candidate code outside the jail asked for
        try:
            with open(log_path, "a") as log:
                log.write(f"kernelagent: could not enter the sandbox: {exc}\n")
        finally:
            os._exit(70)
    child_setup(log_path, workdir, [conn.fileno()])
    candidate_side.candidate_main(job, conn, workdir)


def _reference_process(job: dict[str, Any], conn: Connection, workdir: Path) -> None:
    from kernelagent.harness.child import reference_side

    reference_side.reference_main(job, conn, workdir)


class Job:
    """Runs one evaluation and produces the fields of an EvalResult (as a dict)."""

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
        self.job_id = request["job"]
        self.config = EvalConfig.from_dict(request["config"])
        self.fingerprint = fingerprint
        self.jail = jail
        self.root = scratch_root / f"job-{uuid.uuid4().hex[:12]}"
        self.rng = random.SystemRandom()
        self.result: dict[str, Any] = {"status": None, "reason": "", "compiled": False, "correct": False,
                                       "stage": None, "trials": [], "timings": {}, "flags": [],
                                       "stage_seconds": {}, "kernels": [], "memory": {}}
        self.checks: dict[str, CheckRecord] = {}
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
        self.hold: gate_mod.Hold | None = None
        self.alone = bool((request.get("options") or {}).get("alone"))
        self.out_of_memory = False  # an out-of-memory error was seen (retried alone when it ran beside others)

    # -- helpers -------------------------------------------------------------------
    def fail(self, status: str, reason: str, stage: str | None) -> None:
        if self.result["status"] is None:
            self.result.update(status=status, reason=reason, stage=stage)

    def flag(self, item: dict[str, str]) -> None:
        self.result["flags"].append(item)

    def enter(self, name: str) -> None:
        now = time.monotonic()
        seconds = self.result["stage_seconds"]
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
        if self.ref is not None and self.ref.pid is not None:
            gate_mod.signal_processes([self.ref.pid], stop)

    def limit(self, name: str) -> float:
        return self.config.timeouts.limit(name, self.config.backend)

    # -- the run ---------------------------------------------------------------------
    def fork(self) -> None:
        """Start the job's two processes. Called before the caller sends this job's nonce and
        before any secret seed is drawn, so neither is in the candidate's memory."""
        self.started = time.monotonic()
        self.started_epoch = time.time()
        self.scratch = self.root / "candidate"
        self.refdir = self.root / "reference"
        self.scratch.mkdir(parents=True)
        self.refdir.mkdir(parents=True)
        os.chmod(self.root, 0o711)
        os.chmod(self.scratch, 0o700)
        flags = _static_flags(self.request["problem_source"])
        self.smoke = not self.fingerprint.get("cuda") and self.config.smoke_inputs_on_cpu and flags["has_smoke"]
        input_set = "smoke" if self.smoke else "main"
        # The problem the job runs: the caller's, or on the CPU its derived-smoke rewrite.
        self.problem_source = self.request["problem_source"]
        self.result["derived"] = {}
        if not self.fingerprint.get("cuda") and self.config.smoke_inputs_on_cpu and not flags["has_smoke"] \
                and self.config.backend != "cuda":
            input_set = self.plan_cpu_inputs()
            if input_set == Status.TOO_LARGE:  # nothing is forked: the verdict is about the machine
                self.result.update(device="cpu", input_set="main")
                self.result["stage_seconds"]["total_server"] = time.monotonic() - self.started
                shutil.rmtree(self.root, ignore_errors=True)
                return
        derived_sources = self.derive_check_sets(flags)
        (self.scratch / "problem.py").write_text(self.problem_source)
        (self.scratch / "candidate.py").write_text(self.request["candidate_source"])
        (self.refdir / "problem.py").write_text(self.problem_source)
        options = self.request.get("options", {})
        if self.config.backend == "cuda" and options.get("cuda_cache_dir") and self.fingerprint.get("cuda"):
            from kernelagent.harness.server import build_cache

            build_cache.stage(options["cuda_cache_dir"], self.request.get("candidate_sha256", ""),
                              self.scratch / ".ka-build-cache")
        # Not secret (the candidate's process holds it): the seed of the first, unchecked call.
        self.compile_seed = self.rng.getrandbits(40)
        self.child_job = {"job_id": self.job_id, "config": self.request["config"],
                          "device": "cuda:0" if self.fingerprint.get("cuda") else "cpu", "smoke": self.smoke,
                          "ipc": options.get("ipc", True), "problem_source": self.problem_source,
                          "derived_sources": derived_sources,
                          "candidate_sha256": self.request.get("candidate_sha256", ""),
                          "capability": self.fingerprint.get("capability"), "compile_seed": self.compile_seed,
                          "device_free_bytes": self.fingerprint.get("free_bytes")}
        if self.request.get("want_baselines") and self.fingerprint.get("cuda") and self.config.compile_modes:
            # The reference compiles the torch.compile baselines while the candidate is checked
            # (reference_side.start_compiling): they are wanted only if it is correct, but the
            # compile is host work that would otherwise sit on the evaluation's critical path.
            inductor_dir, triton_dir = self.baseline_dirs()
            self.child_job["baselines_compile"] = {"compile_modes": list(self.config.compile_modes),
                                                   "inductor_dir": str(inductor_dir), "triton_dir": str(triton_dir)}
        self.result["input_set"] = input_set
        self.result["device"] = self.fingerprint.get("gpu_name", "cpu") if self.fingerprint.get("cuda") else "cpu"
        self.to_ref, ref_end = FORK.Pipe()
        self.to_cand, cand_end = FORK.Pipe()
        if self.config.backend == "cuda" and not self.fingerprint.get("cuda"):
            ref_end.close()
            cand_end.close()
            return  # compile-only: precompile_only() runs in this process, nothing is forked
        self.ref = FORK.Process(target=_reference_process, name="kernelagent-reference",
                                args=(self.child_job, ref_end, self.refdir))
        self.cand = FORK.Process(target=_candidate_process, name="kernelagent-candidate",
                                 args=(self.child_job, cand_end, self.scratch, self.jail))
        self.ref.start()
        self.cand.start()
        ref_end.close()
        cand_end.close()
        # Liveness through pidfds, not Process.sentinel: the children close every descriptor they
        # inherited, the sentinel pipe's write end included, which would read as a death.
        self.ref_alive_fd = os.pidfd_open(self.ref.pid)
        self.cand_alive_fd = os.pidfd_open(self.cand.pid)
        self.gate.register(self)  # from now on a neighbour's timed loop stops these processes too

    def abandon(self) -> None:
        """The job will not run (its nonce never came): its processes go, nothing is reported."""
        self.gate.unregister(self)
        for proc in (self.cand, self.ref):
            _kill_group(proc)
            if proc is not None:
                proc.join(5)
        for conn in (getattr(self, "to_ref", None), getattr(self, "to_cand", None)):
            if conn is not None:
                conn.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def plan_cpu_inputs(self) -> str:
        """On the CPU, for a problem without get_smoke_inputs(): the sizes the whole job runs at
        (derive.plan_cpu_inputs, in a forked helper). Returns the result's input_set, or
        Status.TOO_LARGE after setting that verdict."""
        started = time.monotonic()
        source = self.request["problem_source"]
        plan = _plan_cpu_inputs(source, self.refdir, self.limit("start"))
        self.result["stage_seconds"]["derive"] = time.monotonic() - started
        if "error" in plan:
            self.result["derived"]["note"] = f"smoke sizes were not derived: {plan['error']}"
            # Never the main sizes blindly: the static estimate (fp32 assumed) must fit.
            from kernelagent.harness import derive

            try:
                shapes = derive.input_shapes(source)
            except SyntaxError:
                shapes = None
            needed = None if shapes is None else 2 * 4 * 4 * sum(math.prod(s) for s in shapes)
            available = derive.available_memory()
            if needed is not None and available is not None and needed > available:
                self.too_large(needed, available, self.result["derived"]["note"])
                return Status.TOO_LARGE
            return "main"
        self.result["derived"]["note"] = str(plan.get("note", ""))
        if plan.get("input_set") == "derived-smoke":
            from kernelagent.harness import derive

            overrides = plan["overrides"]
            env = derive._Module(source).env()
            self.problem_source = derive.apply(source, overrides)
            self.result["derived"].update(smoke=overrides, main={k: env.get(k) for k in overrides})
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
        self.result["memory"].update(needed_bytes=needed, available_bytes=available)
        self.fail(Status.TOO_LARGE, f"too large for this machine: needs about {_gib(needed)}, "
                                    f"{_gib(available)} available; {detail}", "start")

    def derive_check_sets(self, flags: dict[str, bool]) -> list[str]:
        """Derived check sets (derive.derive_check_variants) for a problem without
        get_extra_inputs(): one rewritten problem source per set, for both children to import.
        The sets vary only constants the model's construction does not read, so the model is
        always built from the main problem; the reference validates each set when it runs."""
        if not (self.config.extra_inputs and self.config.derived_checks > 0) or flags["has_extra"] or self.smoke:
            return []
        from kernelagent.harness import derive

        try:
            # Two spare sets: the reference drops those the model cannot take (reference_side).
            variants = derive.derive_check_variants(self.problem_source, self.config.derived_checks + 2)
            sources = [derive.apply(self.problem_source, v) for v in variants]
        except (ValueError, SyntaxError) as exc:
            self.result["derived"]["sets_note"] = f"no check sets derived: {exc}"
            return []
        env = derive._Module(self.problem_source).env()
        self.derived_dims = {}
        sets = []
        for j, v in enumerate(variants):
            dims = ", ".join(f"{k}={tuple(x) if isinstance(x, list) else x}" for k, x in v.items())
            main = {k: env.get(k) for k in v}
            name = f"derived shapes {j} ({dims})"
            self.derived_dims[f"extra:{j}"] = (dims, ", ".join(f"{k}={x}" for k, x in main.items()))
            sets.append({"name": name, "kind": f"extra:{j}", "overrides": dict(v), "main": main})
        self.result["derived"].update(sets=sets, skipped=[])
        return sources

    def run(self) -> dict[str, Any]:
        if self.result["status"] == Status.TOO_LARGE:  # decided in fork(); nothing was started
            return self.result
        if self.config.backend == "cuda" and not self.fingerprint.get("cuda"):
            return self.precompile_only()
        # Secrets, drawn now that the candidate's process exists without them.
        self.ref_nonce = secrets.token_hex(16)
        self.base_seed = self.config.seed if self.config.seed is not None else self.rng.getrandbits(40)
        self.result["seeds"] = {"base": self.base_seed, "secret": self.config.seed is None,
                                "trials": [self.base_seed + i for i in range(self.config.trials)],
                                "weights": self.config.weight_seed, "compile": self.compile_seed}
        try:
            protocol.send(self.to_ref, "ref_nonce", self.job_id, nonce=self.ref_nonce)
            self.supervise()
        except StageTimeout:
            if self.stage == "timing" and getattr(self, "slot_limited", None):
                self.fail(Status.TIMEOUT, f"the timed loop held the device for more than {self.slot_limited:.0f} s "
                                          "(50x the reference's time per call, at least "
                                          f"{SLOT_MIN_S:.0f} s) while other evaluations waited for it; the "
                                          "candidate's processes were killed. Work the candidate queues "
                                          "outside its calls (threads, other streams) counts here", self.stage)
            else:
                self.fail(Status.TIMEOUT, f"stage '{self.stage}' ran past its {self.limit(self.stage):.0f} s limit; "
                                          "the candidate's processes were killed", self.stage)
        except CandidateGone:
            self.cand_died()
        except ReferenceGone as exc:
            self.out_of_memory = self.out_of_memory or "out of device memory" in str(exc)
            self.fail(Status.HARNESS_ERROR, f"the reference process {exc} during stage '{self.stage}'", self.stage)
        except protocol.ProtocolError as exc:
            self.candidate_protocol(str(exc))
        except Exception:  # noqa: BLE001 - a bug of ours must not take the server down
            self.fail(Status.HARNESS_ERROR, "harness error:\n" + traceback.format_exc(limit=4), None)
        finally:
            _kill_group(self.cand)
            if self.cand is not None:
                self.cand.join(5)
        self.finish_result()
        return self.result

    def finish_result(self) -> None:
        if self.result["status"] == Status.CORRECT and self.request.get("want_baselines"):
            try:
                self.run_baselines()
            except Exception:  # noqa: BLE001
                self.result["baselines"] = {"errors": {"harness": traceback.format_exc(limit=3)}}
        self.ref_stats()
        self.shared_device = self.gate.unregister(self)
        _kill_group(self.ref)
        if self.ref is not None:
            self.ref.join(5)
        self.conclude_concurrency()
        self.to_ref.close()
        self.to_cand.close()
        for fd in (getattr(self, "ref_alive_fd", None), getattr(self, "cand_alive_fd", None)):
            if fd is not None:
                os.close(fd)
        self.result["log"] = _tail(self.scratch / "candidate.log")
        options = self.request.get("options", {})
        if self.config.backend == "cuda" and options.get("cuda_cache_dir"):
            try:  # the candidate's processes are dead: nothing of theirs can race this copy
                from kernelagent.harness.server import build_cache

                build_cache.publish(self.scratch, options["cuda_cache_dir"], self.request.get("candidate_sha256", ""))
            except Exception:  # noqa: BLE001 - the cache is an optimisation
                traceback.print_exc()
        ref_log = _tail(self.refdir / "reference.log")
        if self.result["status"] in (Status.BAD_PROBLEM, Status.HARNESS_ERROR) and ref_log.strip():
            self.result["log"] += "\n--- reference process ---\n" + ref_log
        self.result["stage_seconds"]["total_server"] = time.monotonic() - self.started
        shutil.rmtree(self.root, ignore_errors=True)

    def conclude_concurrency(self) -> None:
        """What running beside other jobs cost this one (result.concurrency), and the rule for
        memory: an out-of-memory error in a job that shared the device is a harness error the
        caller re-runs alone (caller/evaluator.py), never the candidate's; alone, it is the
        candidate's as before."""
        shared = bool(getattr(self, "shared_device", False))
        self.concurrency.update(shared_device=shared, alone=self.alone,
                                span=[round(getattr(self, "started_epoch", time.time()), 4), round(time.time(), 4)])
        if self.out_of_memory and shared and not self.alone and \
                self.result["status"] in (Status.RUNTIME_ERROR, Status.HARNESS_ERROR, Status.CRASHED):
            self.result.update(status=Status.HARNESS_ERROR, correct=False,
                               reason="out of device memory while other evaluations shared the device; it is re-run "
                                      "alone before anything is said about the candidate (was: "
                                      + str(self.result.get("reason", ""))[:300] + ")")
            self.concurrency["retry_alone"] = True
        self.result["concurrency"] = gate_mod.describe(self.concurrency)

    def precompile_only(self) -> dict[str, Any]:
        """A CUDA candidate without a GPU: compile its sources with nvcc; nothing runs.
        Compiled is all that can be said here."""
        from kernelagent.harness.server.precompile import precompile

        result = precompile(self.request["candidate_source"], self.scratch / "precompile",
                            timeout=self.config.timeouts.cuda_build)
        self.result["stage_seconds"]["nvcc"] = result.seconds
        if result.ok:
            self.result.update(status=Status.COMPILED, compiled=True, stage="compile",
                               reason="the CUDA sources compiled with nvcc (compile-only: this machine has no GPU, "
                                      "so the extension was not linked or run; correctness and timing need a GPU)")
        elif result.skipped:
            self.result.update(status=Status.HARNESS_ERROR, stage="compile",
                               reason="cannot check this CUDA candidate without a GPU: " + result.skipped)
        else:
            self.result.update(status=Status.COMPILE_ERROR, stage="compile", reason=result.message)
        self.result["log"] = "\n".join(result.commands)[-LOG_TAIL_BYTES:]
        self.result["stage_seconds"]["total_server"] = time.monotonic() - self.started
        shutil.rmtree(self.root, ignore_errors=True)
        return self.result

    # -- channels ------------------------------------------------------------------------
    def ref_recv(self, accept: set[str], deadline: float) -> dict[str, Any]:
        assert self.ref is not None
        while True:
            ready = self.wait([self.to_ref, self.ref_alive_fd], deadline)
            if not ready:
                raise StageTimeout()
            if self.to_ref in ready:
                try:
                    message = protocol.recv(self.to_ref, accept | {"ref_error"}, self.job_id, self.ref_nonce)
                except EOFError:
                    self.ref.join(2)
                    raise ReferenceGone(_describe_exit(self.ref.exitcode)) from None
                if message["type"] == "ref_error":
                    self.ref_error(message)
                return message
            self.ref.join(2)
            raise ReferenceGone(_describe_exit(self.ref.exitcode))

    def ref_error(self, message: dict[str, Any]) -> None:
        if message["kind"] == "bad_problem":
            self.fail(Status.BAD_PROBLEM, "the problem file failed to run:\n" + message["message"], "start")
        elif message["kind"] == "too_large":
            # The machine's limit, never the candidate's: bench shows it as skipped.
            self.fail(Status.TOO_LARGE, message["message"], "start")
        else:
            self.fail(Status.HARNESS_ERROR, message["message"], self.stage)
        raise _Stop()

    def cand_recv(self, accept: set[str], deadline: float, max_bytes: int = protocol.MAX_CANDIDATE_FRAME,
                  stage_deadlines: bool = False) -> dict[str, Any]:
        """The next message from the candidate's process that is one of `accept`. `stage`
        messages are progress reports, accepted only in the order start, load, compile; a
        `failure` ends the job. Anything else is a protocol violation."""
        assert self.cand is not None
        while True:
            ready = self.wait([self.to_cand, self.cand_alive_fd], deadline)
            if not ready:
                raise StageTimeout()
            if self.to_cand not in ready:
                raise CandidateGone()
            try:
                message = protocol.recv(self.to_cand, accept | {"stage", "failure"}, self.job_id, max_bytes=max_bytes)
            except EOFError:
                raise CandidateGone() from None
            if message["type"] == "failure":
                if not self.ready:
                    # The candidate runs the problem's code too (its inputs): before blaming it,
                    # hear whether the problem itself works. A broken problem is the user's error
                    # (bad_problem, raised from ref_recv), never the candidate's verdict.
                    self.ready = self.ref_recv({"ref_ready"}, self.clock() + self.limit("start"))
                self.candidate_failure(message)
                raise _Stop()
            if message["type"] == "stage":
                self.candidate_stage(message["stage"])
                if stage_deadlines:
                    deadline = self.stage_clock + self.limit(self.stage)
                continue
            return message

    def candidate_stage(self, name: str) -> None:
        if self.stage in _START_STAGES:
            order = list(_START_STAGES)
            if name in order and order.index(name) >= order.index(self.stage):
                if name != self.stage:
                    self.enter(name)
                return
            raise protocol.ProtocolError(f"stage {name[:30]!r} reported during '{self.stage}'")
        # Later stages are the server's to set; the candidate's reports are only checked.
        if name not in ("correctness", "timing", "post-check", "profile", self.stage):
            raise protocol.ProtocolError(f"unknown stage {name[:30]!r}")

    def relay_payloads(self, records: list[Any]) -> list[bytes]:
        n = sum(1 for r in records if isinstance(r, dict) and r.get("kind") == "bytes")
        if n > 512:
            raise protocol.ProtocolError("too many tensors")
        return [protocol.recv_payload(self.to_cand) for _ in range(n)]

    # -- supervision -----------------------------------------------------------------------
    def supervise(self) -> None:
        try:
            self._supervise()
        except _Stop:
            pass
        finally:
            if getattr(self, "_memory", None) is not None:
                self._memory.__exit__(None, None, None)
                self._memory = None

    def _supervise(self) -> None:
        assert self.ref is not None and self.cand is not None
        config = self.config
        # 1. start, load, compile: the reference gets ready while the candidate imports.
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
        if config.compile_only:
            self.cand_recv({"done"}, self.clock() + 30)
            self.conclude([])
            return

        # 2. correctness: each check's seed revealed only when it runs. Beside other jobs, the
        # device's memory for this one is reserved first (server/gate.py MemoryLedger).
        ready = self.ready
        need = gate_mod.job_memory_bytes(int(ready.get("input_bytes", 0)), int(ready.get("output_bytes", 0)),
                                         int(ready.get("param_bytes", 0)))
        self._memory = self.gate_memory.reserve(self, need) if self.gate_memory is not None else None
        if self._memory is not None:
            waited = time.monotonic()
            self._memory.__enter__()
            self.concurrency["memory_wait_s"] = round(time.monotonic() - waited, 3)
        self.enter("correctness")
        deadline = self.clock() + self.limit("correctness")
        protocol.send(self.to_cand, "plan", self.job_id,
                      reference_ops=self.ready.get("reference_ops", []) if config.defences else [])
        base = self.base_seed
        checks = [{"name": f"trial {i}", "kind": "main", "seed": base + i, "stop": True}
                  for i in range(config.trials)]
        if self.ready.get("alt"):
            checks.append({"name": "signed-normal inputs", "kind": "alt", "seed": base + SEED_ALT, "stop": True})
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
                           "seed": base + SEED_EXTRA + j, "stop": False})
        self.planned = [c["name"] for c in checks]
        for check in checks:
            if not self.run_check(check, deadline):
                return self.end_early()

        # 3. the timed loop, clocked here.
        if config.timing:
            self.enter("timing")
            if not self.timed_loop(self.clock() + self.limit("timing")):
                return self.end_early()
            if config.post_timing_check:
                self.enter("post-check")
                post = {"name": "post-timing check", "kind": "main", "seed": base + SEED_POST_TIMING, "stop": True}
                self.planned.append(post["name"])
                if not self.run_check(post, self.clock() + self.limit("post-check")):
                    return self.end_early()

        # 4. the end: evidence, profile, flags.
        self.finish_candidate(device_share=bool(config.defences and self.fingerprint.get("cuda")))
        self.conclude(self.claimed_flags)

    def run_check(self, check: dict[str, Any], deadline: float) -> bool:
        """One check: the candidate runs it, the reference compares. True to go on."""
        protocol.send(self.to_cand, "run_check", self.job_id, name=check["name"], kind=check["kind"],
                      seed=check["seed"])
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
        payloads = self.relay_payloads(message["outputs"] + message["inputs"])
        record = self.compare(check, message["n_outputs"], message["outputs"], message["inputs"], payloads, deadline,
                              candidate_error=error[:4000] if error is not None else None)
        stop = not record.passed and check["stop"]
        protocol.send(self.to_cand, "check_reply", self.job_id, passed=record.passed, stop=stop)
        return not stop

    def compare(self, check: dict[str, Any], n_outputs: int, outputs: list[Any], inputs: list[Any],
                payloads: list[bytes], deadline: float, candidate_error: str | None = None) -> CheckRecord:
        protocol.send(self.to_ref, "check", self.job_id, self.ref_nonce, name=check["name"], kind=check["kind"],
                      seed=check["seed"], n_outputs=n_outputs, outputs=outputs, inputs=inputs,
                      stop_on_failure=bool(check.get("stop", True)), candidate_error=candidate_error)
        for data in payloads:
            protocol.send_payload(self.to_ref, data)
        record = CheckRecord.from_message(self.ref_recv({"verdict"}, deadline))
        self.record_check(record)
        return record

    def record_check(self, record: CheckRecord) -> None:
        self.checks[record.name] = record
        if "out of device memory" in record.message:
            self.out_of_memory = True
        if record.skipped and record.kind in self.derived_dims:
            self.result["derived"].setdefault("skipped", []).append({"name": record.name, "reason": record.message})
        self.result["trials"].append({
            "name": record.name, "seed": record.seed, "passed": record.passed, "max_abs_err": record.max_abs_err,
            "max_rel_err": record.max_rel_err, "rel_l2_err": record.rel_l2_err,
            "message": record.message if not record.passed or record.skipped else ""})

    def timed_loop(self, deadline: float) -> bool:
        """The calibration and the candidate's loop, holding the device's timing slot: every
        other job stopped, the device idle before each (server/gate.py)."""
        with self.gate.hold(self, self.idle_probe if self.fingerprint.get("cuda") else None,
                            self.concurrency) as hold:
            self.hold = hold
            try:
                return self._timed_loop(deadline)
            finally:
                self.hold = None
                if hold.busy:
                    self.flag(verdict.flag(
                        "device-busy", "another process kept the device busy through the timed loop (the harness "
                        f"waited {self.gate.idle_wait_s:.0f} s for it to go idle): the times are not the "
                        "candidate's alone and do not count", "review"))

    def idle_probe(self) -> bool:
        """The trusted reference process's reading: is the device idle (no other context's
        kernels stretching a tiny spin)? Bounded in wall time: the holder's clock is paused."""
        protocol.send(self.to_ref, "idle_probe", self.job_id, self.ref_nonce)
        if not wait([self.to_ref, self.ref_alive_fd], timeout=30):
            raise ReferenceGone("did not answer the device idle probe within 30 s")
        message = self.ref_recv({"idle"}, self.clock() + 1)
        self.concurrency["probe_us"] = max(float(self.concurrency.get("probe_us", 0.0)), float(message["us"]))
        self.concurrency["probes"] = int(self.concurrency.get("probes", 0)) + 1
        return bool(message["idle"])

    def _timed_loop(self, deadline: float) -> bool:
        config = self.config
        if self.fingerprint.get("cuda"):
            # The reference's eager time (trusted) sizes the loop on a GPU; a candidate slower than
            # eager gets a longer loop, never a shorter one.
            estimate = max(float(self.ready.get("estimate_ms", 1.0)), 0.005)
        else:  # the interpreter is far slower than eager: the server's clock on the checks
            estimate = max(min(self.call_latency_ms or [1.0]), 1e-3)
        total = int(min(max(-(-config.target_ms // estimate), config.min_reps), config.max_reps))
        warmup = int(min(max(-(-config.warmup_ms // estimate), 2), 50))
        budget = self.harness_budget()
        output_bytes = max(int(self.ready.get("output_bytes", 0)), 1)
        keep, segments, calls = 0, 1, total
        if config.defences:
            # Every measured call keeps its output until the server has had the secret subset
            # verified. Memory holds `keep` outputs (two thirds of the harness's budget), so the
            # loop runs in segments of `keep` calls: after each segment the outputs the server
            # chose in secret (maybe none) are compared with the candidate stopped, and the slots
            # are reused. Any call can be checked, and the loop stays as long as timing needs.
            keep = int(max(1, min(total, MAX_KEPT_CALLS, (2 * budget // 3) // output_bytes)))
            segments = min(-(-total // keep), MAX_SEGMENTS)
            calls = keep
        if self.fingerprint.get("cuda") and self.gate.active() > 1:
            # Beside other jobs, the slot is held no longer than this loop plausibly needs: its two
            # loops (calibration, candidate) at 50x the reference's time per call, SLOT_SEGMENT_S
            # per segment for its comparisons, and at least SLOT_MIN_S. A candidate whose own
            # queued work makes every call wait (a spinner thread: each synchronize waits for its
            # backlog) times out here, not at the stage limit with every other job waiting.
            slot_limit = max(SLOT_MIN_S, 2 * 50 * (total + warmup) * estimate / 1e3 + SLOT_SEGMENT_S * segments)
            if self.clock() + slot_limit < deadline:
                deadline = self.clock() + slot_limit
                self.slot_limited = slot_limit
        l2 = self.fingerprint.get("l2_bytes")
        order = {"calls": calls, "warmup_calls": warmup, "keep": keep, "segments": segments,
                 "budget_bytes": int(max(budget - keep * output_bytes, 0)), "l2_bytes": int(l2) if l2 else None}
        measured = calls * segments
        # The loop's own cost, measured in the trusted process on this clock, segment by segment
        # exactly as the candidate's loop; then the candidate's loop. Each warms up first,
        # unclocked; the clock runs from each segment's `go` (which reveals its calls' seed) to its
        # report, so nothing of the measured calls can happen outside it.
        calibration_s = None
        settings = {k: v for k, v in self.config.to_dict().items() if k not in ("seed", "trials", "timeouts")}
        calibration_key = hashlib.sha256(json.dumps([self.problem_source, settings, sorted(order.items())],
                                                    sort_keys=True, default=str).encode()).hexdigest()
        reused = False
        if self.fingerprint.get("cuda") or config.defences:
            calibration_s = self.gate.calibrations.get(calibration_key)
            if calibration_s is None:
                calibration_s = self.calibrate(order, segments, deadline)
                if calibration_s is None:
                    raise ReferenceGone("ran out of device memory running the empty timed loop (calibration)")
                self.gate.calibrations[calibration_key] = calibration_s
            else:
                reused = True
        if self.hold is not None:
            self.hold.wait_idle()  # the calibration's own work, and anything a neighbour left, drained
        protocol.send(self.to_cand, "time", self.job_id, seed=self.rng.getrandbits(40), **order)
        warmed = self.cand_recv({"warmed"}, deadline)
        ipc_kept = warmed["kept"]  # on a GPU: the kept slots' IPC handles, sent before the clock ran
        if len(ipc_kept) not in (0, keep):
            raise protocol.ProtocolError("the timed loop did not run as ordered")
        timed_seed = self.base_seed + SEED_TIMING + self.rng.getrandbits(30)
        # The verified calls, drawn now in secret over the whole loop (the last call always).
        chosen = set(self.rng.sample(range(measured - 1), min(TIMED_CHECKS, measured - 1))) | {measured - 1} \
            if keep else set()
        self.result["timed_loop"] = {"calls": measured, "segments": segments, "warmup_calls": warmup, "kept": keep,
                                     "verified": len(chosen), "server_loop_s": 0.0, "calibration_s": calibration_s,
                                     "calibration_reused": reused}
        samples: list[Any] = []
        loop_s = 0.0
        ok, meaningful = True, True
        # The SM clock over the candidate's loop, read here (NVML, a thread) where it cannot touch it.
        sampler = self.clock_sampler(measured * max(float(self.ready.get("estimate_ms", 1.0)), 0.005) / 1e3)
        clocks = None
        if sampler is not None:
            sampler.start()
        try:
            for segment in range(segments):
                first = segment * calls
                protocol.send(self.to_cand, "go", self.job_id, seed=timed_seed + first)
                t0 = time.perf_counter()
                message = self.cand_recv({"timing"}, deadline)
                loop_s += time.perf_counter() - t0
                kept = ipc_kept or message["kept"]
                if message["calls"] != calls or len(kept) != keep or not isinstance(message["samples_ms"], list) \
                        or len(samples) + len(message["samples_ms"]) > 100_000:
                    raise protocol.ProtocolError("the timed loop did not run as ordered")
                samples += message["samples_ms"]
                meaningful = meaningful and bool(message["meaningful"])
                kept_payloads = []
                for entry in kept:
                    if not isinstance(entry, dict) or not isinstance(entry.get("outputs"), list) \
                            or not isinstance(entry.get("index"), int):
                        raise protocol.ProtocolError("malformed kept output")
                    kept_payloads.append([] if ipc_kept else self.relay_payloads(entry["outputs"]))
                here = sorted(i for i in chosen if first <= i < first + calls)
                # Nothing of the candidate's may run while its kept outputs are read: its processes
                # are stopped until the comparisons are done (GPU work it queued still completes).
                stopped = bool(here) and bool(ipc_kept) and self.stop_candidate(True)
                for index in here:
                    slot = index - first
                    entry = kept[slot]
                    if not ipc_kept and entry["index"] != slot:
                        raise protocol.ProtocolError("kept outputs out of order")
                    check = {"name": f"timed call {index}", "kind": "main", "seed": timed_seed + index, "stop": True}
                    self.planned.append(check["name"])
                    record = self.compare(check, len(entry["outputs"]), entry["outputs"], [], kept_payloads[slot],
                                          deadline)
                    if not record.passed:
                        ok = False
                        break
                if stopped:
                    self.stop_candidate(False)
                last = segment == segments - 1
                protocol.send(self.to_cand, "check_reply", self.job_id, passed=ok, stop=not ok or last)
                if not ok:
                    break
        finally:
            clocks = sampler.stop() if sampler is not None else None
        self.result["timed_loop"]["server_loop_s"] = loop_s
        if not ok:
            return False
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in samples):
            raise protocol.ProtocolError("malformed timing samples")
        if calibration_s is not None and verdict.needs_recalibration(samples, measured, loop_s, calibration_s):
            # Noise only ever adds time, and a slow calibration both shrinks the server's time and
            # widens the slack, enough to let a forged clock through once on a busy CPU. So when
            # the claim falls short of the server's time, the calibration runs again and the
            # smaller one counts (an honest candidate's claim matches, and pays nothing).
            again = self.calibrate(order, segments, deadline)
            self.result["timed_loop"]["calibrations_s"] = [calibration_s, again]
            if again is not None:
                calibration_s = min(calibration_s, again)
                self.result["timed_loop"]["calibration_s"] = calibration_s
                self.gate.calibrations[calibration_key] = calibration_s
        decision = verdict.trusted_time(samples, measured, loop_s, calibration_s,
                                        meaningful and bool(self.fingerprint.get("cuda")))
        timing = dict(decision.timing, samples_ms=[float(x) for x in samples][:5000], source=decision.source,
                      clocks_mhz=clocks or [])
        self.result["timings"]["candidate"] = timing
        self.result["timed_loop"].update(server_ms_per_call=decision.server_ms,
                                         claimed_mean_ms=decision.claimed_mean_ms, source=decision.source)
        for item in decision.flags:
            self.flag(item)
        for item in self.timer_flags(clocks, timing["samples_ms"]):
            self.flag(item)
        if config.defences:  # on the CPU this notes that the check does not apply
            roof = verdict.check_roofline(self.fingerprint, self.ready, float(timing["median_ms"]),
                                          config.roofline_margin)
            if roof:
                self.flag(roof)
        return ok

    def clock_sampler(self, expected_s: float) -> Any:
        """A ClockSampler for the device (child/timing.py), or None: no GPU, no NVML in the probe,
        or an NVML whose start-up is too slow to pay for on every evaluation."""
        nvml = self.fingerprint.get("nvml") or {}
        if not self.fingerprint.get("cuda") or not nvml.get("available") or \
                float(nvml.get("init_ms") or 1e9) > NVML_INIT_MAX_MS:
            return None
        from kernelagent.harness.child.timing import ClockSampler

        try:
            return ClockSampler.for_device(self.fingerprint.get("uuid"), self.fingerprint.get("pci_bus_id"), expected_s)
        except Exception:  # noqa: BLE001 - no clocks rather than no evaluation
            return None

    def timer_flags(self, clocks: list[float] | None, samples_ms: list[float]) -> list[dict[str, str]]:
        """The timer traps that concern the candidate's loop: the clock dropped over it, or the
        device probe found that the L2 flush does not evict or that persisting L2 cannot be reset."""
        from kernelagent.harness.result import throttling_flag

        flags = []
        throttled = throttling_flag("candidate's", clocks, samples_ms)
        if throttled is not None:
            flags.append(verdict.flag(throttled.kind, throttled.message))
        if not self.fingerprint.get("cuda"):
            return flags
        flush = self.fingerprint.get("l2_flush") or {}
        if flush.get("evicts") is False and self.config.flush_l2:
            flags.append(verdict.flag(
                "l2-flush", f"the L2 flush did not evict in the device probe (a read after the flush took "
                f"{flush.get('cold_ms')} ms, a second read {flush.get('warm_ms')} ms; rule: {flush.get('rule')}): "
                "the times are partly warm-L2"))
        reset = self.fingerprint.get("l2_reset")
        if reset and reset != "ok":
            flags.append(verdict.flag("l2-reset", "persisting L2 lines were not reset before each timed call: "
                                      + str(reset)))
        return flags

    def stop_candidate(self, stop: bool) -> bool:
        """SIGSTOP (or SIGCONT) every process of the candidate's job: its process group and,
        in a jail, every process of its pid namespace (a setsid helper included)."""
        assert self.cand is not None
        sig = signal.SIGSTOP if stop else signal.SIGCONT
        targets = set()
        try:
            os.killpg(self.cand.pid, sig)
        except OSError:
            pass
        try:
            children = open(f"/proc/{self.cand.pid}/task/{self.cand.pid}/children").read().split()
            namespace = os.readlink(f"/proc/{children[0]}/ns/pid") if children else None
        except (OSError, IndexError):
            namespace = None
        if namespace and namespace != os.readlink("/proc/self/ns/pid"):
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        if os.readlink(f"/proc/{entry}/ns/pid") == namespace:
                            targets.add(int(entry))
                    except OSError:
                        continue
        for pid in targets:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        return True

    def calibrate(self, order: dict[str, Any], segments: int, deadline: float) -> float | None:
        """The server's clock around the reference process running the timed loop with an empty
        model, segment by segment as the candidate's loop: the loop's own cost, in seconds. None
        when the reference could not run it (out of memory beside the candidate's kept outputs,
        on a second run), which the reference reports instead of dying."""
        # The candidate's processes are stopped meanwhile: work of theirs beside the empty loop
        # would inflate the loop's measured cost, and so shrink the time charged to the candidate.
        stopped = self.stop_candidate(True)
        try:
            if self.hold is not None:
                self.hold.wait_idle()  # kernels the candidate queued before it was stopped, drained
            protocol.send(self.to_ref, "calibrate", self.job_id, self.ref_nonce, seed=self.rng.getrandbits(40),
                          **order)
            if self.ref_recv({"warmed", "calibrated"}, deadline)["type"] == "calibrated":
                return None
            total = 0.0
            for _ in range(segments):
                protocol.send(self.to_ref, "go", self.job_id, self.ref_nonce, seed=self.rng.getrandbits(40))
                t0 = time.perf_counter()
                message = self.ref_recv({"calibrated"}, deadline)
                total += time.perf_counter() - t0
                if message["seconds"] < 0:
                    return None
            return total
        finally:
            if stopped:
                self.stop_candidate(False)

    def harness_budget(self) -> int:
        """Device bytes the harness itself may hold in one process beyond the problem's own
        inputs, outputs and parameters (kept outputs, fresh input sets made ahead): 1.5 times the
        problem's I/O bytes (at least 64 MiB), within 30% of the free memory. With one set of
        inputs and outputs in use, a process then stays within about 2.5x the problem's bytes
        (the memory plan, issue 12). On the CPU a fixed 256 MiB."""
        if not self.fingerprint.get("cuda"):
            # The knob lets the CPU tests drive the segmented loop with small problems.
            return int(os.environ.get("KERNELAGENT_CPU_KEEP_BYTES", KEEP_CPU_BYTES))
        io = int(self.ready.get("input_bytes", 0)) + int(self.ready.get("output_bytes", 0))
        free = int(self.ready.get("memory", {}).get("free_bytes", 0))
        return int(min(KEEP_DEVICE_SHARE * free, max(1.5 * io, 64 << 20)))

    def finish_candidate(self, device_share: bool) -> None:
        self.enter("profile" if (self.config.profile or device_share) else "finishing")
        protocol.send(self.to_cand, "finish", self.job_id, profile=bool(self.config.profile),
                      device_share=device_share)
        deadline = self.clock() + self.limit("profile")
        message = self.cand_recv({"kernels", "done"}, deadline)
        if message["type"] == "kernels":
            self.result["kernels"] = [k for k in message["kernels"][:50] if isinstance(k, dict)]
            message = self.cand_recv({"done"}, deadline)
        self.claimed_flags = verdict.trusted_flags(message["flags"])
        peak = message["memory"].get("peak_bytes")
        if isinstance(peak, int):
            self.result["memory"]["peak_candidate_bytes"] = peak

    def end_early(self) -> None:
        """A check failed and stops the evaluation: collect the candidate's evidence, conclude."""
        try:
            self.finish_candidate(device_share=False)
        except (StageTimeout, CandidateGone, protocol.ProtocolError, _Stop):
            self.claimed_flags = []
        self.conclude(self.claimed_flags)

    def conclude(self, claimed: list[dict[str, str]]) -> None:
        self.enter("finished")
        outcome = verdict.conclude_checks(self.planned, self.checks, self.config.compile_only,
                                          bool(self.result["compiled"]), derived=self.derived_dims)
        flags = list(self.result["flags"]) + list(outcome.flags) + list(claimed)
        if self.result["status"] is None:
            outcome = verdict.apply_rejects(outcome, flags)
            self.result.update(status=outcome.status, reason=outcome.reason, stage=outcome.stage,
                               correct=outcome.status == Status.CORRECT)
        self.result["flags"] = flags

    # -- failures -------------------------------------------------------------------------
    def candidate_failure(self, message: dict[str, Any]) -> None:
        self.result["flags"] += verdict.trusted_flags(message["flags"])
        kind, stage, text = message["kind"], message["stage"] or self.stage, message["message"]
        if stage not in ("start", "load", "compile", "correctness", "timing", "post-check", "profile"):
            stage = self.stage
        if kind in ("out_of_memory", "harness_out_of_memory"):
            self.out_of_memory = True  # beside other jobs, re-run alone (conclude_concurrency)
        if kind == "compile_error":
            self.fail(Status.COMPILE_ERROR, text, stage)
        elif kind == "rejected":
            flag_kind = "output-alias" if "shares memory" in text else "output-type" if "output" in text else "rejected"
            self.flag(verdict.flag(flag_kind, text, "reject"))
            self.fail(Status.REJECTED, f"[{flag_kind}] {text}", stage)
        elif kind == "out_of_memory":
            self.fail(Status.RUNTIME_ERROR, "out of memory on the device in the candidate's own code "
                                            f"({self.memory_context()}): " + text, stage)
        elif kind == "harness_out_of_memory" and self.harness_oom_plausible():
            # Only a claim of the candidate's process, believed where the problem is large enough
            # for the harness's own allocations to run out (elsewhere it is the candidate's).
            self.fail(Status.HARNESS_ERROR, "the harness ran out of device memory making a check's inputs in the "
                                            f"candidate's process ({self.memory_context()}): " + text, stage)
        elif kind == "cuda_fault":
            self.fail(Status.RUNTIME_ERROR, "CUDA fault (illegal memory access or device assert): " + text, stage)
        elif kind == "protocol":
            self.candidate_protocol(text)
        else:
            self.fail(Status.RUNTIME_ERROR, text, stage)
        self.result["correct"] = False

    def memory_context(self) -> str:
        gib = 1 << 30
        io = int(self.ready.get("input_bytes", 0)) + int(self.ready.get("output_bytes", 0))
        free = self.fingerprint.get("free_bytes")
        where = f"; {free / gib:.1f} GiB were free on the device before the job" if free else ""
        return f"the problem's inputs and outputs take {io / gib:.2f} GiB{where}"

    def harness_oom_plausible(self) -> bool:
        free = self.fingerprint.get("free_bytes")
        io = int(self.ready.get("input_bytes", 0)) + int(self.ready.get("output_bytes", 0)) + \
            int(self.ready.get("param_bytes", 0))
        return bool(free) and 3 * io >= 0.5 * int(free)

    def candidate_protocol(self, text: str) -> None:
        message = (f"the candidate's process broke the harness protocol during '{self.stage}': {text}; "
                   "a kernel must not write to the harness's channels")
        self.flag(verdict.flag("protocol", message, "reject"))
        self.fail(Status.REJECTED, "[protocol] " + message, self.stage)
        self.result["correct"] = False

    def cand_died(self) -> None:
        assert self.cand is not None
        self.cand.join(2)
        code = self.cand.exitcode
        if code == 70 and self.stage == "start":
            self.fail(Status.HARNESS_ERROR, "the candidate's sandbox could not be set up (see the log)", "start")
        else:
            self.fail(Status.CRASHED, f"the candidate's process {_describe_exit(code)} during stage '{self.stage}'",
                      self.stage)
        self.result["correct"] = False

    # -- after the verdict ------------------------------------------------------------------
    def run_baselines(self) -> None:
        assert self.ref is not None
        modes = list(self.config.compile_modes) if (self.fingerprint.get("cuda") or
                                                    self.config.compile_baseline_on_cpu) else []
        started = time.monotonic()
        inductor_dir, triton_dir = self.baseline_dirs()
        l2 = self.fingerprint.get("l2_bytes")
        protocol.send(self.to_ref, "baselines", self.job_id, self.ref_nonce, compile_modes=modes,
                      l2_bytes=int(l2) if l2 else None, inductor_dir=str(inductor_dir), triton_dir=str(triton_dir),
                      seed=self.base_seed + SEED_TIMING, budget_bytes=self.harness_budget() // 2)
        try:
            deadline = self.clock() + self.config.timeouts.baselines
            # The reference compiles every runner first (host work, beside other jobs), then times
            # them holding the device's timing slot.
            if self.ref_recv({"warmed", "baseline_timings"}, deadline)["type"] == "warmed":
                with self.gate.hold(self, self.idle_probe if self.fingerprint.get("cuda") else None,
                                    self.concurrency) as hold:
                    protocol.send(self.to_ref, "go", self.job_id, self.ref_nonce, seed=0)
                    message = self.ref_recv({"baseline_timings"}, deadline)
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
            self.result["baselines"] = {"errors": {"timeout": f"baselines ran past {self.config.timeouts.baselines:.0f} s"}}
        except (ReferenceGone, _Stop) as exc:
            self.result["baselines"] = {"errors": {"reference": f"the reference process {exc}"}}
        self.result["stage_seconds"]["baselines"] = time.monotonic() - started
        if not modes and not self.fingerprint.get("cuda"):
            self.result["baselines"].setdefault("skipped", {})["compile"] = \
                "torch.compile baseline skipped on the CPU (pass compile_baseline_on_cpu to force)"

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

    def ref_stats(self) -> None:
        if self.ref is None or not self.ref.is_alive():
            return
        try:
            protocol.send(self.to_ref, "exit", self.job_id, self.ref_nonce)
            message = self.ref_recv({"ref_stats"}, self.clock() + 10)
            peak = message["memory"].get("peak_bytes")
            if isinstance(peak, int):
                self.result["memory"]["peak_reference_bytes"] = peak
        except (StageTimeout, ReferenceGone, _Stop, OSError, protocol.ProtocolError):
            pass


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


class _Stop(Exception):
    """The job has its verdict (a failure was reported): stop supervising."""
