"""The caller's side of the harness: `Evaluator.evaluate(problem, candidate_source)`.

The caller's process never imports candidate code, never imports torch for an evaluation
and never initialises CUDA. It starts the harness server (server.py) with a scrubbed
environment, pinned to one device, sends it jobs, and enforces a hard overall deadline: a
server that stops answering is killed and restarted, and the caller goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import subprocess
import queue
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kernelagent import settings
from kernelagent.errors import UserError
from kernelagent.harness import interpreter, protocol, stats, verdict
from kernelagent.harness.caller import zygote
from kernelagent.harness.jail import sandbox
from kernelagent.harness.server.audit import evidence_options, needs_win_audit
from kernelagent.harness.caller.baseline_cache import BaselineCache
from kernelagent.harness.caller.baseline_jobs import ProblemBaselines
from kernelagent.harness.caller.channel import ServerChannel, shut_down
from kernelagent.harness.caller.results import apply_kernel_evidence, first_try_summary
from kernelagent.harness.caller.pids import PidProcess
from kernelagent.harness.config import EvalConfig
from kernelagent.harness.result import EvalResult, Flag, Status
from kernelagent.problem import Problem, candidate_static_problem, load_problem, sha256_text
from kernelagent.text import clean_text

log = logging.getLogger(__name__)


# Evaluator.evaluate(..., cancel=): how often a waiting call looks at its event, how long it then
# waits for the server to say the job ended, and the reason its result gives.
CANCELLED_REASON = "cancelled by the caller: this evaluation's processes were killed (nothing else was)"


class HarnessStartError(RuntimeError):
    """The harness server could not be started (no torch, broken install...)."""


def _resolve_device(device: str) -> tuple[str, str | None]:
    """('auto'|'cpu'|'cuda', CUDA_VISIBLE_DEVICES value or None)."""
    device = (device or "auto").strip().lower()
    if device in ("auto", "cpu", "cuda"):
        return device, None
    if device.startswith("cuda:") and device[5:].isdigit():
        return "cuda", device[5:]
    raise ValueError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N")


class Evaluator(ServerChannel):
    """Evaluates candidates for problems on one device, several at once.

    Use as a context manager, or call close(). Thread-safe: call `evaluate` from as many threads
    as you like (or `map`); the server runs up to `concurrency` jobs at a time (0: its default,
    from the host's CPUs and the device's memory; 1: one at a time), their host work overlapping
    and every timed phase alone on the device (server/gate.py).
    """

    def __init__(self, device: str = "auto", cache_dir: str | Path | None = None,
                 isolation: str = "auto", start_timeout: float = 180.0, hide: list[str | Path] | None = None,
                 cpus: list[int] | None = None, share_compile_cache: bool = True,
                 coordinate_baselines: bool = True, concurrency: int = 0, daemon: bool | None = None):
        self.requested_device, self.visible_devices = _resolve_device(device)
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 0:
            raise ValueError(f"concurrency must be a whole number >= 0 (0: the server's default), got {concurrency!r}")
        self.concurrency_requested = concurrency
        # A warm harness that outlives this command (caller/daemon.py): None reads KERNELAGENT_DAEMON.
        from kernelagent.harness.caller import daemon as daemon_mod

        self.daemon_requested = daemon_mod.wanted(daemon)
        self._daemon: Any = None
        self.daemon_note: str | None = None
        self.daemon_info: dict[str, Any] = {}
        self.cache = BaselineCache(cache_dir)
        # Host contention (several evaluators on one machine; pool.py chooses these):
        # - cpus: the CPUs this server and its jobs run on, and so its thread pools' sizes
        #   (OMP, MKL, Inductor's compile workers). A performance measure, not a defence: a
        #   candidate may widen its own affinity (only a cgroup could stop that).
        # - share_compile_cache: the reference side's Inductor and Triton caches persist under
        #   the cache root (hidden from every job, like the baselines), so a problem's
        #   torch.compile baselines compile once per machine rather than once per evaluation.
        #   Candidates never get a shared cache: each compiles in its own scratch.
        # - coordinate_baselines: evaluators that miss the same baseline key at once take turns
        #   (BaselineCache.claim): the first times them, the others reuse its entry.
        self.cpus = sorted(set(cpus)) if cpus else None
        self.share_compile_cache = share_compile_cache
        self.coordinate_baselines = coordinate_baselines
        self.reference_compile_dir: Path | None = None
        self._unbilled_start_s = 0.0
        if isolation not in ("auto", "bwrap", "namespaces", "none"):
            raise ValueError(f"unknown isolation {isolation!r}: use auto, bwrap, namespaces or none")
        self.isolation_requested = isolation
        # Directories no candidate may see (the bench store, say), besides the caches and home.
        self.hide = [str(Path(p).resolve()) for p in (hide or [])]
        self.start_timeout = start_timeout
        self._lock = threading.Lock()  # starting and stopping the server
        self._send_lock = threading.Lock()
        # job id -> (the queue its replies go to, the connection it was sent on)
        self._pending: dict[str, tuple["queue.Queue[dict[str, Any] | None]", Connection]] = {}
        self._heard = 0.0  # when the server last sent anything (monotonic)
        self._reader: threading.Thread | None = None
        self._reader_conn: Connection | None = None  # the connection _reader reads (and alone closes)
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._fingerprint: dict[str, Any] | None = None
        self._scratch_root: Path | None = None
        self.isolation: dict[str, Any] = {}
        # Built CUDA extensions (cuda_build.py), shared by the evaluations of this evaluator and
        # of later ones; None until the server has started (it must be writable there).
        self.cuda_cache_dir: Path | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _server_env(self, scratch_root: Path | None = None) -> dict[str, str]:
        env = sandbox.server_environ()
        from kernelagent.harness.server import ncu_session

        try:  # every KERNELAGENT_* value the servers get (NCU_LOCK...), checked before any starts
            settings.check_environment(env, unknown=False)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        # The servers' temp directory is their scratch root: the Nsight Compute locks stay in
        # the caller's private folder, so that every server and the caller's own sessions share them.
        env["KERNELAGENT_NCU_LOCK_DIR"] = str(ncu_session.lock_dir_for_servers())
        scratch_root = scratch_root or self._scratch_root
        if scratch_root is not None:
            # The only writable place under bubblewrap; torch's and Triton's caches go there.
            env["TMPDIR"] = str(scratch_root)
            env["TORCHINDUCTOR_CACHE_DIR"] = str(scratch_root / "inductor")
        if self.visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.visible_devices
        if self.cpus:
            threads = str(len(self.cpus))
            # Inductor's compile workers are the server's to share among its jobs
            # (server/main.py share_compile_workers), from the CPUs it is pinned to.
            for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                env[name] = threads
        if self.requested_device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        env.setdefault("PYTHONUNBUFFERED", "1")
        # The server decides from its own probe: the answer a restarting server hands itself is
        # never a caller's (server/main.py _restart_knowing)
        env.pop("KERNELAGENT_SERVER_DEVICE_KNOWN", None)
        return env

    def start(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        started = time.monotonic()
        try:
            self._start()
        finally:
            # Billed to the next evaluation's stage_seconds["server_start"]: a busy host's
            # profile then shows what (re)starting servers cost (bench_throughput.py).
            self._unbilled_start_s += time.monotonic() - started

    def _start(self) -> None:
        self._daemon = None
        self.daemon_note = None
        if self.daemon_requested:
            from kernelagent.harness.caller import daemon

            try:
                self._start_daemon()
                return
            except daemon.DaemonUnavailable as exc:  # said in every result's isolation
                self.daemon_note = f"not used: {exc}"
        self._scratch_root = sandbox.make_scratch_root()
        parent_sock, child_sock = socket.socketpair()
        cmd, prefix = self._server_command(self._scratch_root)
        cmd += ["--fd", str(child_sock.fileno())]
        log_path = self._scratch_root / "server.log"
        with open(log_path, "ab") as server_log:
            where = zygote.address() if prefix is None else None
            if where:  # torch already imported (the test suite)
                try:
                    self._proc = zygote.spawn(where, cmd, self._server_env(), child_sock.fileno(),
                                              server_log.fileno(), self.start_timeout, cwd=self._scratch_root)
                except zygote.ZygoteError as exc:
                    child_sock.close()
                    parent_sock.close()
                    raise HarnessStartError(str(exc)) from None
            else:
                self._proc = subprocess.Popen((prefix or []) + cmd, env=self._server_env(),
                                              pass_fds=[child_sock.fileno()], stdin=subprocess.DEVNULL,
                                              cwd=self._scratch_root,  # never the user's folder
                                              stdout=server_log, stderr=server_log, start_new_session=True)
        child_sock.close()
        self._conn = Connection(parent_sock.detach())
        if not self._conn.poll(self.start_timeout):
            self._kill_server()
            raise HarnessStartError(f"the harness server did not start within {self.start_timeout:.0f} s "
                                    f"(log: {log_path})")
        self._hello(prefix, lambda: log_path.read_text(errors="replace")[-2000:])

    def _start_daemon(self) -> None:
        """Connect to this user's warm harness for these settings, starting it where none
        answers (caller/daemon.py)."""
        from kernelagent.harness.caller import daemon

        where = daemon.runtime_dir()
        scratch = sandbox.make_scratch_root()
        try:
            cmd, prefix = self._server_command(scratch, extra_rw=[where])
            settings = [self.requested_device, str(self.visible_devices), self.isolation_requested,
                        ",".join(self.hide), ",".join(map(str, self.cpus or [])), str(self.concurrency_requested),
                        str(self.cache.root.resolve()), str(self.share_compile_cache), str(bool(prefix))]
            attached = daemon.attach((prefix or []) + cmd, self._server_env(scratch), settings, scratch,
                                     self.start_timeout)
        except daemon.DaemonStartFailed as exc:
            sandbox.remove_tree(scratch)
            raise HarnessStartError(str(exc)) from None
        except BaseException:
            sandbox.remove_tree(scratch)
            raise
        if not attached.spawned:
            sandbox.remove_tree(scratch)  # the harness found has its own
        self._conn = attached.conn
        self._daemon = attached
        self._proc = PidProcess(attached.pid)
        self._hello(prefix, lambda: "", attached.hello)

    def _server_command(self, scratch_root: Path, extra_rw: list[Path] | None = None) -> tuple[list[str], list[str] | None]:
        """The server's command line (without --fd or --listen) and bubblewrap's prefix, if any;
        sets where the build and reference-compile caches are."""
        # Isolated: only this installation's code on its path, never the working directory's
        # (an argparse.py there ran inside the server: interpreter.py).
        cmd = interpreter.module_argv(
            "kernelagent.harness.server", "--device", self.requested_device, "--scratch-root", str(scratch_root),
            "--isolation", "none" if self.isolation_requested == "none" else
            "namespaces" if self.isolation_requested == "namespaces" else "auto")
        for path in [str(self.cache.root.resolve())] + self.hide:
            cmd += ["--hide", path]
        if self.cpus:
            cmd += ["--cpus", ",".join(map(str, self.cpus))]
        if self.concurrency_requested:
            cmd += ["--concurrency", str(self.concurrency_requested)]
        prefix = None
        persistent = _made_dir(self.cache.root / "cuda-ext")
        shared = _made_dir(self.cache.root / "reference-compile") if self.share_compile_cache else None
        # The device probe's answers (server/device_probe.py cached_probe), hidden from jobs like the rest.
        probes = _made_dir(self.cache.root / "device-probe")
        if probes is not None:
            cmd += ["--probe-cache", str(probes)]
        calibrations = _made_dir(self.cache.root / "calibrations")  # shared: server/calibration_store.py
        cmd += ["--calibration-cache", str(calibrations)] if calibrations is not None else []
        self.reference_compile_dir = shared
        # Only the server reads and writes the build cache; jobs get verified copies of their entries.
        self.cuda_cache_dir = persistent or scratch_root / "cuda-ext"
        # As root, bubblewrap's layer maps the server to uid 0 outside, and jobs inside it cannot
        # switch to an unprivileged uid: `auto` then runs the server unwrapped and every job in
        # its own namespaces as an unprivileged uid (jail/candidate.py job_uid); `bwrap` asks for
        # the layer anyway (jobs keep uid 0 outside, said in the result's isolation).
        if self.isolation_requested == "bwrap" or (self.isolation_requested == "auto" and os.geteuid() != 0):
            writable = [p for p in (persistent, shared, probes) if p is not None] + list(extra_rw or [])
            prefix = sandbox.bubblewrap_command(scratch_root, extra_rw=writable or None)
            if prefix is None and writable:
                prefix = sandbox.bubblewrap_command(scratch_root, extra_rw=list(extra_rw or []) or None)
                if prefix is not None:
                    self.cuda_cache_dir = scratch_root / "cuda-ext"
                    self.reference_compile_dir = None
            if prefix is None and self.isolation_requested == "bwrap":
                raise HarnessStartError("bubblewrap isolation was requested but `bwrap` is missing or cannot "
                                        "create namespaces here")
        return cmd, prefix

    def _hello(self, prefix: list[str] | None, log_tail: Any, hello: dict[str, Any] | None = None) -> None:
        assert self._conn is not None
        try:
            hello = hello or protocol.recv(self._conn, {"hello"}, max_bytes=protocol.MAX_CALLER_FRAME)
        except (EOFError, OSError, protocol.ProtocolError):
            tail = log_tail()
            self._kill_server()
            raise HarnessStartError(f"the harness server exited at start:\n{tail}") from None
        self._fingerprint = hello["fingerprint"]
        if self._daemon is not None:
            from kernelagent.harness.caller import daemon

            info = hello.get("daemon") if isinstance(hello.get("daemon"), dict) else {}
            if isinstance(info.get("pid"), int):
                self._proc = PidProcess(info["pid"])
            if isinstance(info.get("scratch_root"), str):
                self._scratch_root = Path(info["scratch_root"])
            self.daemon_info = daemon.describe(hello, self._daemon)
        self.start_reader(self._conn)
        if "error" in self._fingerprint:
            log.warning("device probe: %s", self._fingerprint["error"])
        if self.requested_device == "cuda" and not self._fingerprint.get("cuda"):
            which = f"cuda:{self.visible_devices}" if self.visible_devices is not None else "cuda"
            self._kill_server()
            raise HarnessStartError(f"device {which} was asked for, but no such CUDA GPU is visible here")
        jail = dict(self._fingerprint.get("isolation") or {})
        self.isolation = {
            "bubblewrap": bool(prefix),
            "server": ("bubblewrap: read-only root, the user's home hidden, no network; writable: the scratch "
                       "root only" if prefix else "no bubblewrap around the server"),
            "jail": jail,
            "mode": ("bwrap+" if prefix else "") + str(jail.get("mode", "none")),
            "secrets_scrubbed": True,
        }
        if self._daemon is not None:
            self.isolation["daemon"] = dict(self.daemon_info)
        elif self.daemon_note:
            self.isolation["daemon"] = self.daemon_note
        if not prefix and jail.get("mode", "none") == "none":
            self.isolation["warning"] = ("no isolation: candidate code runs as this user, without namespaces "
                                         "(install bubblewrap, or allow user namespaces)")

    @property
    def concurrency(self) -> dict[str, Any]:
        """The server's jobs at once, its default and why (after start)."""
        return dict((self._fingerprint or {}).get("concurrency") or {})

    def _server_log_tail(self, error: str) -> str:
        """For a private server that died mid-job: its log's last line, so that the reason says
        why where the server could (a test beside hostile ones, 2 cores under load, lost one with
        no more than "the harness server died")."""
        if "server died" not in error or self._scratch_root is None or getattr(self, "_daemon", None) is not None:
            return ""
        try:
            lines = [line for line in (self._scratch_root / "server.log").read_text(errors="replace").splitlines()
                     if line.strip()]
        except OSError:
            return ""
        return f" (its log ends: {clean_text(lines[-1]).strip()[:300]})" if lines else ""

    def _kill_server(self, misbehaved: bool = False) -> None:
        """The server stopped answering or broke the protocol: it goes, and the next evaluation
        starts another. A warm harness is killed only when it `misbehaved` (hung past a job's
        deadline, a result without the job's nonce: it is this user's, and broken for everyone);
        else only this command's connection to it ends."""
        if getattr(self, "_daemon", None) is not None and not misbehaved:
            self.hang_up(self._conn)
            self._conn, self._proc, self._daemon = None, None, None
            return
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, 9)
            except (ProcessLookupError, PermissionError, OSError):
                pass
            self._proc.wait(timeout=10)
        self._proc = None
        self.hang_up(self._conn)
        self._conn = None

    def abort(self) -> None:
        """Kill the harness server (and so every job process) at once, without waiting for an
        evaluation in progress or taking the lock: for Ctrl-C. The evaluation in progress ends
        as a harness error; the next one starts a fresh server. With a warm harness only this
        command's connection goes: the harness ends its jobs, and serves the others on."""
        if getattr(self, "_daemon", None) is not None:
            shut_down(self._conn)  # its reader closes it (channel.py)
            return
        proc = self._proc
        if proc is not None:
            try:
                os.killpg(proc.pid, 9)
            except (ProcessLookupError, PermissionError, OSError):
                pass

    def close(self) -> None:
        with self._lock:
            if getattr(self, "_daemon", None) is not None:
                # A warm harness outlives this command: only the connection ends (its jobs with it).
                if self._conn is not None:
                    with contextlib.suppress(OSError):
                        with self._send_lock:
                            protocol.send(self._conn, "shutdown", "-")
                    self.hang_up(self._conn)
                self._conn, self._proc, self._daemon, self._scratch_root = None, None, None, None
                return
            if self._conn is not None and self._proc is not None and self._proc.poll() is None:
                try:
                    with self._send_lock:
                        protocol.send(self._conn, "shutdown", "-")
                    self._proc.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._kill_server()
            if self._scratch_root is not None:
                sandbox.remove_tree(self._scratch_root)
                self._scratch_root = None

    # -- queries -----------------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        with self._lock:
            self.start()
            return dict(self._fingerprint or {})

    # -- evaluation --------------------------------------------------------------------
    def evaluate(self, problem: Problem | str | Path, candidate_source: str,
                 config: EvalConfig | None = None, *, cancel: threading.Event | None = None) -> EvalResult:
        """Evaluate `candidate_source` against `problem`. Never raises for a bad candidate;
        raises ProblemError for a problem file that cannot be read or parsed. `cancel`: set it
        (from any thread) to give up on this evaluation: the server kills this job's processes
        and nothing else (other evaluations and the server go on), and the result is a harness
        error whose reason says it was cancelled."""
        return self.evaluate_answering(problem, candidate_source, config, cancel=cancel)

    def evaluate_answering(self, problem: Problem | str | Path, candidate_source: str,
                           config: EvalConfig | None = None, *, cancel: threading.Event | None = None,
                           on_answered: Callable[[], None] | None = None) -> EvalResult:
        """`evaluate`, calling `on_answered` once the server has answered for the candidate's job,
        before the result waits for its problem's baselines (a bench's dispatcher then gives the
        device's room to its next evaluation: bench/dispatch.py)."""
        config = config or EvalConfig()
        from kernelagent.harness.cuda_source import BACKENDS

        if config.backend not in BACKENDS:
            raise ValueError(f"unknown backend {config.backend!r}: use {' or '.join(BACKENDS)}")
        if not isinstance(problem, Problem):
            problem = load_problem(problem)
        started = time.monotonic()
        base = EvalResult(**verdict.fields(verdict.fold([verdict.HarnessFault("")])),  # until decided
                          problem=str(problem.path), problem_sha256=problem.sha256,
                          candidate_sha256=sha256_text(candidate_source), config=config.to_dict(),
                          seeds={"secret": config.seed is None, "base": config.seed, "weights": config.weight_seed})
        static = candidate_static_problem(candidate_source)
        if static:
            verdict.apply_to(base, [verdict.Failed(Status.COMPILE_ERROR, static, "load")])
            base.stage_seconds["total"] = time.monotonic() - started
            return base
        static_flags: list[Flag] = []
        if config.defences and config.static_check != "off":
            from kernelagent.harness.caller import static_check

            findings = static_check.check_source(candidate_source, backend=config.backend)
            rejects = [f for f in findings if f.severity == "reject"]
            if rejects and config.static_check == "reject":
                verdict.apply_to(base, [verdict.Failed(Status.REJECTED, static_check.summary(rejects), "static")])
                base.flags = [Flag(f"static:{f.kind}", f.message_with_line(), "reject") for f in rejects]
                base.flags += [Flag(f"static:{f.kind}", f.message_with_line(), "info")
                               for f in findings if f.severity != "reject"]
                base.isolation = {"static_pass": "rejected before any process started"}
                base.stage_seconds["total"] = time.monotonic() - started
                return base
            static_flags = [Flag(f"static:{f.kind}", f.message_with_line(), "info") for f in findings]
        # This problem's baselines (caller/baseline_jobs.py): a job of their own beside the
        # candidate's, or another evaluation's entry after this verdict; its claims end with it.
        with contextlib.ExitStack() as claims:
            with self._lock:
                try:
                    self.start()
                except HarnessStartError as exc:
                    verdict.apply_to(base, [verdict.HarnessFault(str(exc))])
                    return base
                base.fingerprint = dict(self._fingerprint or {})
                base.isolation = dict(self.isolation)
                if self._unbilled_start_s:
                    base.stage_seconds["server_start"], self._unbilled_start_s = self._unbilled_start_s, 0.0
            cache_key = self.cache.key(problem.sha256, base.fingerprint, config)
            cached = self.cache.get(cache_key) if config.use_baseline_cache else None
            options: dict[str, Any] = {"cuda_cache_dir": str(self.cuda_cache_dir) if self.cuda_cache_dir else None}
            if self.reference_compile_dir is not None:
                options["reference_compile_dir"] = str(self.reference_compile_dir)
            plan = ProblemBaselines(channel=self, cache=self.cache, key=cache_key, config=config,
                                    fingerprint=base.fingerprint, problem_sha256=problem.sha256,
                                    problem_source=problem.source, cancel=cancel, deadline_s=self._deadline(config),
                                    options={k: v for k, v in options.items() if k == "reference_compile_dir"},
                                    coordinate=self.coordinate_baselines,
                                    jobs_at_once=int(self.concurrency.get("jobs") or 1))
            claims.callback(plan.release)
            cached = plan.begin(cached)
            if config.kernel_evidence:
                # The server runs it as the job's last stage (server/evidence.py), hiding these too.
                options["evidence"] = evidence_options(config, base.candidate_sha256, cached, self._evidence_hide())
            request = {"config": config.to_dict(), "problem_source": problem.source,
                       "candidate_source": candidate_source, "want_baselines": plan.in_job,
                       "candidate_sha256": base.candidate_sha256, "options": options}
            stats.prefetch("numpy")  # the speedup intervals after the reply need it: loaded meanwhile
            reply = self._round_trip(request, self._deadline(config), cancel, plan.early)
            if reply is not None and "result" in reply and \
                    (reply["result"].get("concurrency") or {}).get("retry_alone"):
                # Out of memory beside other jobs: never the candidate's verdict until it ran alone.
                first_result = reply["result"]
                first = first_result.get("stage_seconds") or {}
                first_retries = (first_result.get("concurrency") or {}).get("alloc_retries")
                request["options"] = dict(options, alone=True)
                reply = self._round_trip(request, self._deadline(config), cancel, plan.early)
                if reply is not None and "result" in reply:
                    reply["result"].setdefault("concurrency", {})["retried_alone"] = True
                    if first_retries:  # why it was re-run: the device was full while it was timed
                        reply["result"]["concurrency"]["first_try_alloc_retries"] = first_retries
                    # What the first try met, where and after how long in each stage: a cold wave of
                    # jobs that all ran past a stage limit said only how long the first try took.
                    reply["result"]["concurrency"]["first_try"] = first_try_summary(first_result)
                    reply["result"].setdefault("stage_seconds", {})["first_try"] = \
                        float(first.get("total_server", 0.0) or 0.0)
            if on_answered is not None:
                on_answered()
            if reply is not None and "result" in reply and not reply.get("cancelled"):
                cached = plan.finish(reply["result"], base.stage_seconds) or cached
            base.stage_seconds["start_to_reply"] = time.monotonic() - started
            if reply is not None and reply.get("cancelled"):
                verdict.apply_to(base, [verdict.HarnessFault(CANCELLED_REASON)])
                return base
            if reply is None:
                verdict.apply_to(base, [verdict.Failed(Status.TIMEOUT, "the harness did not answer within its overall "
                                                       "deadline; the server was killed and will be restarted", None)])
                return base
            if "error" in reply:
                verdict.apply_to(base, [verdict.HarnessFault(reply["error"] + self._server_log_tail(reply["error"]))])
                return base
            evidence = reply["result"].pop("evidence", None)
            result = self._merge(base, reply["result"], cached, cache_key, config)
        result.flags.extend(static_flags)
        if config.kernel_evidence:
            apply_kernel_evidence(result, evidence, candidate_source)  # caller/results.py
        if needs_win_audit(result, config):  # a win the server could not know of: audited now
            return self.evaluate(problem, candidate_source, dataclasses.replace(config, audit=True), cancel=cancel)
        result.stage_seconds["total"] = time.monotonic() - started
        return result

    def _evidence_hide(self) -> list[str]:
        """What the evidence's jail hides besides what every job's jail hides: the caller's own
        scratch, build cache and baseline cache."""
        hide = [str(p) for p in getattr(self, "hide", [])]
        for attr in ("_scratch_root", "cuda_cache_dir"):
            if getattr(self, attr, None):
                hide.append(str(getattr(self, attr)))
        if getattr(self, "cache", None) is not None:
            hide.append(str(self.cache.root))
        return hide

    def _deadline(self, config: EvalConfig) -> float:
        t = config.timeouts
        load, compile_ = t.limit("load", config.backend), t.limit("compile", config.backend)
        # Jobs ahead of this one (admission) and neighbours' timed phases (the gate) add to its
        # wall time, not to its stage clocks: a generous multiple of what one job may take.
        # The kernel evidence's ncu session is the last stage; one runs at a time on a host.
        evidence = t.limit("evidence") if config.kernel_evidence else 0.0
        one = t.start + load + compile_ + 2 * t.correctness + 2 * t.timing + t.baselines + evidence + 60
        jobs = int(self.concurrency.get("jobs") or 1)
        return one + (jobs - 1) * (2 * t.timing + t.baselines / 4 + evidence)

    def map(self, jobs: list[tuple[Problem | str | Path, str, EvalConfig | None]]) -> list[EvalResult]:
        """Evaluate several (problem, candidate source, config) at once; results in order."""
        from concurrent.futures import ThreadPoolExecutor

        jobs = list(jobs)
        if not jobs:
            return []
        with ThreadPoolExecutor(max_workers=min(len(jobs), 64), thread_name_prefix="kernelagent-eval") as pool:
            return list(pool.map(lambda job: self.evaluate(*job), jobs))

    def _merge(self, base: EvalResult, raw: dict[str, Any], cached: dict[str, Any] | None, cache_key: str,
               config: EvalConfig) -> EvalResult:
        """The server's raw result on top of the caller's `base`, with the baselines (caller/results.py)."""
        from kernelagent.harness.caller.results import merge

        return merge(base, raw, cached, cache_key, config, self.cache)


def _made_dir(path: Path) -> Path | None:
    """`path`, created if need be; None where it cannot be (a cache that cannot be written only
    costs time)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return path


def evaluate(problem: Problem | str | Path, candidate_source: str, config: EvalConfig | None = None,
             device: str = "auto") -> EvalResult:
    """One-shot convenience: start a harness, evaluate, shut it down."""
    with Evaluator(device=device) as evaluator:
        return evaluator.evaluate(problem, candidate_source, config)


