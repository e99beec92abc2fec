"""The harness server: a pre-imported process that runs several jobs at once on one device.

Started by the caller (caller/evaluator.py) as `python -m kernelagent.harness.server`, with a
scrubbed environment, pinned to one device. It imports torch and Triton once and never initialises
CUDA itself, so forking a fresh pair of processes per job costs milliseconds. Messages to and from
the caller are typed JSON (protocol.py), each carrying the job id and the caller's secret nonce;
several jobs share the socket, one thread each (`Dispatcher`), their timed phases serialised by
the device's gate (server/gate.py).

Start-up: torch and torch._dynamo are imported once here (every job is forked warm), while the
device probe (server/device_probe.py) runs in a throwaway child; its answer is cached per machine
boot, driver, device and library versions (`--probe-cache`), with free memory read afresh through
NVML.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch  # noqa: F401 - imported once here: every job's processes are forked from this one

from kernelagent import settings
from kernelagent.harness import protocol, verdict
from kernelagent.harness.config import COMPILE_WORKERS_ENV
from kernelagent.harness.server import bytecode, device_probe, gate as gate_mod
from kernelagent.harness.server.admission import Admission
from kernelagent.harness.server.device_lock import DeviceLock
from kernelagent.harness.server.job import Job
from kernelagent.harness.server.processes import kill_group
from kernelagent.harness.server.record_types import DeviceLockInfo


def _import_once(*, expects_cuda: bool) -> None:
    """The imports every job's forked processes inherit warm (Triton; on a GPU torch._dynamo and
    Triton's cache key); without CUDA, Triton under its interpreter (set before it is imported)."""
    if not expects_cuda:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton  # noqa: F401 - pre-import once, so each fork starts warm
    except ImportError:
        pass
    if expects_cuda:
        try:
            # On a GPU every correct candidate's reference compiles the torch.compile baselines (a
            # cache miss) and candidates may use torch.compile themselves: torch._dynamo (4.7 s on
            # an H100 host) is imported once here rather than in every job's processes. (Imported
            # lazily, it would also rebind torch.manual_seed inside the candidate's process; the
            # tampering check knows that rebinding.) The defences' own dispatch modes do not need
            # it (defences.Recorder: _should_skip_dynamo), so on the CPU, where no baseline is
            # compiled unless asked for, it is not imported: 1.8 CPU-s of every server start.
            import torch._dynamo  # noqa: F401
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        # Triton's cache key and lazy imports, once: every job's processes are forked from here
        # and inherit them (child/triton_warm.py: 0.6 s of a candidate's first call on an H100).
        from kernelagent.harness.child import triton_warm

        triton_warm.warm()


class StartLaps:
    """The seconds of each phase of a server's start, each from the end of the one before."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = round(now - self._last, 3)
        self._last = now


def serve(conn: Connection | None, requested_device: str, scratch_root: Path, isolation: str,
          hide: list[str] | None = None, probe_cache: Path | None = None, concurrency: int = 0,
          listener: Any = None, calibration_cache: Path | None = None) -> None:
    """Set up once (the probe, the imports, the jail), then serve `conn` (the caller that started
    this server), or with `listener` (server/listen.py: a warm harness that outlives one command)
    every connection of this user, jobs of all of them sharing the device's gate."""
    laps = StartLaps()
    probe = device_probe.cached_probe(requested_device, probe_cache)
    # No GPU: Triton kernels run under the interpreter, on CPU tensors; TRITON_INTERPRET must be
    # set before anything imports Triton (torch._dynamo does), which reads it at import. A cached
    # probe says at once; an uncached one (a new boot, driver or library) takes seconds in its
    # child, so the imports below run meanwhile on what the machine shows (_expects_cuda), and a
    # wrong guess (device nodes, but no usable CUDA) starts this server again knowing the answer.
    fingerprint = probe() if getattr(probe, "cached", False) else None
    known = settings.get(INTERPRET_KNOWN)
    os.environ.pop(INTERPRET_KNOWN, None)  # for this start only: never inherited by jobs
    expects_cuda = bool(fingerprint.get("cuda")) if fingerprint is not None else \
        (known == "cuda" if known else _expects_cuda(requested_device))
    # Bytecode for what the jobs import in their read-only jails (Inductor: server/bytecode.py), compiled
    # beside this start by a trusted helper, where the installation has none yet.
    background, bytecode_state = bytecode.compile_in_background() if expects_cuda else (None, "not needed (no GPU)")
    # The kernel tracer (issue 55), built on first use, beside the imports below (a thread whose
    # answer is taken before any job's process is forked); its jobs' processes are traced where it loads.
    from kernelagent.harness.trace import build as trace_build

    tracer = trace_build.ServerBuild(cuda=expects_cuda)
    laps.lap("probe_and_setup")
    _import_once(expects_cuda=expects_cuda)
    laps.lap("imports")
    # Every module of ours a job's thread or forked child imports lazily, now, before any job
    # thread exists: a fork while another thread is mid-import leaves that module locked for
    # ever in the child (server/forking.py).
    from kernelagent.harness.server import forking

    for failure in forking.preload():
        print(f"kernelagent harness: preload: {failure}", file=sys.stderr, flush=True)
    laps.lap("preload")
    if fingerprint is None:
        fingerprint = probe()
        if bool(fingerprint.get("cuda")) != expects_cuda and not known:
            _restart_knowing(bool(fingerprint.get("cuda")))
    laps.lap("probe_wait")
    fingerprint["trace"] = tracer.result(cuda=bool(fingerprint.get("cuda")))
    laps.lap("trace_wait")
    from kernelagent.harness.jail import candidate as jail

    sandbox = jail.resolve(isolation, scratch_root, hide)
    fingerprint["isolation"] = sandbox["describe"]
    laps.lap("jail")
    # Where this server's start went (issue 59), in seconds from serve(); the tracer's build beside the imports.
    fingerprint["start_s"] = dict(laps.seconds, trace_build=round(tracer.seconds, 3))
    fingerprint["bytecode"] = bytecode_state if background is None else \
        f"{bytecode_state}: {background.line or 'running'}"
    chosen, why = gate_mod.default_concurrency(cuda=bool(fingerprint.get("cuda")),
                                               device_free_bytes=fingerprint.get("free_bytes"))
    limit = concurrency if concurrency > 0 else chosen
    fingerprint["concurrency"] = {"jobs": limit, "default": chosen, "why": why if concurrency <= 0 else "asked for",
                                  "compile_workers": share_compile_workers(limit)}
    gate = Dispatcher.make_gate(fingerprint, limit, calibration_cache=calibration_cache)
    if listener is not None:
        admission = Dispatcher.make_admission(fingerprint, limit, gate)

        def connection(client: Connection) -> "Dispatcher":
            dispatcher = Dispatcher(client, scratch_root, fingerprint, sandbox, limit, gate=gate, admission=admission)
            protocol.send(client, "hello", "-", fingerprint=protocol.json_safe(fingerprint), pid=os.getpid(),
                          daemon=dict(listener.describe(), scratch_root=str(scratch_root)))
            return dispatcher

        why = listener.serve(connection, busy=lambda: admission.running() > 0)
        print(f"kernelagent harness {os.getpid()}: exiting: {why}", file=sys.stderr, flush=True)
        return
    assert conn is not None
    dispatcher = Dispatcher(conn, scratch_root, fingerprint, sandbox, limit, gate=gate)
    protocol.send(conn, "hello", "-", fingerprint=protocol.json_safe(fingerprint), pid=os.getpid(), daemon={})
    dispatcher.run()


# Fewer compile workers than this per reference process: none (Inductor compiles in the process).
POOL_MIN_WORKERS = 4


def share_compile_workers(jobs: int) -> int:
    """Inductor's compile workers for each reference process that compiles baselines: this
    server's CPUs shared among the jobs it runs at once, at least one. Inductor's own default is
    min(32, CPUs) per process, and a cold server's reference processes compiling at once with it
    ran honest jobs past their 'start' or 'compile' limits (docs/concepts/concurrency.md,
    "Inductor's compile workers"). Set in the environment the job processes are forked with
    (child/compile_workers.py set_compile_workers); TORCHINDUCTOR_COMPILE_THREADS, where the
    caller set it, wins."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    workers = max(1, cpus // max(1, int(jobs)))
    if workers < POOL_MIN_WORKERS:
        # A pool this small does not repay its start: Inductor's workers are processes that each
        # import torch before the first kernel compiles, on the path of a cold `eval` (issue 59).
        workers = 1
    os.environ[COMPILE_WORKERS_ENV] = str(workers)
    return workers



class Dispatcher:
    """Reads the caller's socket on the main thread; each `evaluate` (and each `evaluate_baselines`:
    a problem's baselines, a job of its own, server/job.py run_baselines_only) gets a thread of its own,
    admitted by `Admission` (at most `limit` at once, or alone), and its nonce is handed to it
    when it arrives. Replies go out under one lock. A `cancel` ends one job (its processes are
    killed, its result says so) and nothing else: the server and the other jobs go on."""

    def __init__(self, conn: Connection, scratch_root: Path, fingerprint: dict[str, Any], sandbox: dict[str, Any],
                 limit: int, gate: gate_mod.Gate | None = None, admission: Admission | None = None):
        self.conn, self.scratch_root, self.fingerprint, self.sandbox = conn, scratch_root, fingerprint, sandbox
        # Shared by every connection of a warm harness (server/listen.py): one device, one slot.
        self.gate = gate if gate is not None else self.make_gate(fingerprint, limit)
        self.admission = admission if admission is not None else self.make_admission(fingerprint, limit, self.gate)
        self._send_lock = threading.Lock()
        self._nonces: dict[str, queue.Queue[str]] = {}
        self._jobs: dict[str, Job] = {}
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()

    @staticmethod
    def make_gate(fingerprint: dict[str, Any], limit: int, *, calibration_cache: Path | None = None) -> gate_mod.Gate:
        gate = gate_mod.Gate(idle_wait_s=settings.get("KERNELAGENT_IDLE_WAIT_S"))
        # Shared on a GPU only: on the CPU (a busy runner's noise) every server measures its own.
        gate.calibration_store = gate_mod.CalibrationStore(calibration_cache if fingerprint.get("cuda") else None)
        if fingerprint.get("cuda") and limit > 1:
            gate.memory = gate_mod.MemoryLedger(fingerprint.get("free_bytes"))
        return gate

    @staticmethod
    def make_admission(fingerprint: dict[str, Any], limit: int, gate: gate_mod.Gate) -> Admission:
        """The server's admission, its first wave staggered on a GPU and opened by the gate's slot."""
        stagger = float(settings.get("KERNELAGENT_FIRST_WAVE_S")) if fingerprint.get("cuda") and limit > 1 else 0.0
        admission = Admission(limit, device_lock=DeviceLock.for_fingerprint(fingerprint), stagger_s=stagger)
        gate.hold_listeners.append(admission.slot_taken)
        return admission

    def send(self, msg_type: str, job: str, nonce: str | None = None, /, **fields: Any) -> None:
        with self._send_lock:  # after close(): the closed Connection raises OSError, writing nothing
            protocol.send(self.conn, msg_type, job, nonce, **fields)

    def close(self) -> None:
        """Under the send lock: a job thread still answering never writes to a number reused since."""
        with self._send_lock:
            self.conn.close()

    def run(self) -> None:
        while True:
            try:
                request = protocol.recv(self.conn, {"evaluate", "evaluate_baselines", "nonce", "cancel", "shutdown"},
                                        max_bytes=protocol.MAX_CALLER_FRAME)
            except (EOFError, OSError, protocol.ProtocolError):
                break
            if request["type"] == "shutdown":
                break
            job_id = str(request["job"])
            if request["type"] == "nonce":
                with self._lock:
                    box = self._nonces.get(job_id)
                if box is not None:
                    box.put(str(request["nonce"]))
                continue
            if request["type"] == "cancel":
                self.cancel(job_id)
                continue
            with self._lock:
                if job_id in self._nonces:
                    continue  # a job id in use: the caller's bug; the first job goes on
                self._nonces[job_id] = queue.Queue(maxsize=1)
            threading.Thread(target=self.handle, args=(request,), name=f"job-{job_id}", daemon=True).start()
        self.stop_all()

    def stop_all(self) -> None:
        """The caller is gone or asked us to stop: no job process outlives the server."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            _kill_job(job)

    def cancel(self, job_id: str) -> None:
        """The caller gave up on `job_id`: a job still queued is answered at once and never
        forked; a running job's processes (and its ncu session) are killed, and its thread answers
        once it has unwound (the gate and the device released as after a crash). Else nothing."""
        with self._lock:
            box = self._nonces.get(job_id)
            if box is None or job_id in self._cancelled:
                return
            self._cancelled.add(job_id)
            job = self._jobs.get(job_id)
        if job is None:  # still waiting for admission: `_handle` will see it and return
            self.send("result", job_id, "-", result=dict(CANCELLED))
            return
        try:
            box.put_nowait("")  # a job waiting for its nonce wakes up (and sees the cancellation)
        except queue.Full:
            pass
        _kill_job(job)

    def cancelled(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._cancelled

    def handle(self, request: dict[str, Any]) -> None:
        job_id = str(request["job"])
        alone = bool((request.get("options") or {}).get("alone"))
        try:
            with self.admission.admit(alone=alone, baselines=request.get("type") == "evaluate_baselines") \
                    as device_lock:
                self._handle(request, job_id, device_lock)
        except Exception:  # noqa: BLE001 - the server goes on; the caller hears a harness error
            try:
                fault = verdict.HarnessFault("harness error:\n" + traceback.format_exc(limit=4))
                self.send("result", job_id, "-", result=verdict.fields(verdict.fold([fault])))
            except OSError:
                pass
        finally:
            with self._lock:
                self._nonces.pop(job_id, None)
                self._jobs.pop(job_id, None)
                self._cancelled.discard(job_id)

    def _handle(self, request: dict[str, Any], job_id: str, device_lock: DeviceLockInfo | None = None) -> None:
        cpu_before = _cpu_seconds()
        admitted = time.monotonic()
        job = Job(request, self.scratch_root, self.fingerprint, self.sandbox, gate=self.gate)
        job.concurrency.update(device_lock or {})  # another server's hold of this GPU (server/device_lock.py)
        with self._lock:
            if job_id in self._cancelled:
                return  # cancelled while queued: `cancel` has answered
            self._jobs[job_id] = job
        try:
            self._run_job(job, job_id, cpu_before, admitted)
        finally:
            job.memory.release_device_memory()  # reserved before the fork; a job that never ran frees it here

    def _run_job(self, job: Job, job_id: str, cpu_before: float, admitted: float) -> None:
        try:
            job.start.fork()
        except Exception:  # noqa: BLE001
            job.record(verdict.HarnessFault("harness error:\n" + traceback.format_exc(limit=4)))
        self.send("started", job_id)
        # The job's nonce arrives only now: the job's processes were forked without it.
        try:
            nonce = self._nonces[job_id].get(timeout=120)
        except queue.Empty:
            job.record(verdict.NoNonce("the caller sent no nonce for this job"))
            job.abandon()
            return
        if self.cancelled(job_id):  # before its nonce came, or while it was being forked
            job.abandon()
            self.send("result", job_id, "-", result=dict(CANCELLED))
            return
        if job.facts.status is None:
            job.on_baselines = lambda baselines: self.send("baselines_ready", job_id, nonce,
                                                           baselines=protocol.json_safe(baselines))
            try:
                result = job.run().to_wire()
            except Exception:  # noqa: BLE001
                # a failure of the candidate's, decided before the fault (its evidence, the
                # clean-up), stays its verdict (server/failures.py); else only the fault is sent
                decided = job.record(verdict.ServerFault("harness error:\n" + traceback.format_exc()))
                if decided.later_fault is not None:
                    job.facts.flags.append(decided.later_fault)
                result = verdict.fields(decided) if decided.fresh else job.facts.to_wire()
        else:
            result = job.facts.to_wire()
        if self.cancelled(job_id):  # its processes were killed under it: not a verdict
            result = {**CANCELLED, "stage_seconds": result.get("stage_seconds")}
        if isinstance(result.get("stage_seconds"), dict):
            # Host CPU while the job ran: this server's and its reaped job processes' (with
            # several jobs at once, theirs too: a profile of where a busy host's time goes).
            result["stage_seconds"]["server_cpu"] = round(_cpu_seconds() - cpu_before, 3)
            result["stage_seconds"]["admitted_to_result"] = round(time.monotonic() - admitted, 3)
        self.send("result", job_id, nonce, result=protocol.json_safe(result))


CANCELLED = verdict.fields(verdict.fold([verdict.HarnessFault("cancelled by the caller: the job's processes were "
                                                               "killed")]))


def _kill_job(job: Job) -> None:
    from kernelagent.harness.server import evidence

    kill_group(job.cand)
    kill_group(job.ref)
    evidence.discard(job)


INTERPRET_KNOWN = "KERNELAGENT_SERVER_DEVICE_KNOWN"  # set only by _restart_knowing: "cuda" or "cpu"


def _expects_cuda(requested: str) -> bool:
    """What the machine shows before the probe answers: a CUDA device unless the CPU was asked
    for, CUDA_VISIBLE_DEVICES hides every device, or there is no NVIDIA device node."""
    if requested == "cpu":
        return False
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidiactl")


def _restart_knowing(cuda: bool) -> None:
    """The imports ran on a wrong guess about the device (Triton reads TRITON_INTERPRET once,
    at import): run this server again, in this process, with the probe's answer (now cached
    where a cache directory was given, else probed again). The caller's socket stays open."""
    os.environ[INTERPRET_KNOWN] = "cuda" if cuda else "cpu"
    os.environ.pop("TRITON_INTERPRET", None)
    sys.stdout.flush()
    sys.stderr.flush()
    from kernelagent.harness import interpreter

    os.execv(sys.executable, interpreter.module_argv("kernelagent.harness.server", *sys.argv[1:]))


def _cpu_seconds() -> float:
    import resource

    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="kernelagent harness server (started by Evaluator)")
    parser.add_argument("--fd", type=int, default=None, help="the socket to the caller that started it")
    parser.add_argument("--listen", default=None, help="a warm harness: the Unix socket to listen on (listen.py)")
    parser.add_argument("--idle-timeout", type=float, default=600.0, help="--listen: exit after this long unused")
    parser.add_argument("--owns-scratch", action="store_true", help="remove the scratch root at exit")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--scratch-root", required=True)
    parser.add_argument("--isolation", default="auto")
    parser.add_argument("--hide", action="append", default=[], help="a directory jobs must not see (repeatable)")
    parser.add_argument("--probe-cache", default=None, help="a directory for the device probe's cached answers")
    parser.add_argument("--calibration-cache", default=None,
                        help="a directory for timed loops' calibrations, shared by the servers of this host")
    parser.add_argument("--concurrency", type=int, default=0, help="jobs at once (0: chosen from CPUs and memory)")
    # Applied by __main__.py before torch is imported; accepted here so the command line parses.
    parser.add_argument("--cpus", default=None, help="comma-separated CPUs this server and its jobs run on")
    args = parser.parse_args(argv)
    # No PR_SET_PDEATHSIG here: it fires when the *thread* that started us exits, which
    # kills servers started from short-lived worker threads. We exit when the caller's
    # socket closes (recv raises EOFError), and jobs are bounded by their stage timeouts.
    if (args.fd is None) == (args.listen is None):
        parser.error("give exactly one of --fd and --listen")
    listener = None
    if args.listen:
        from kernelagent.harness.server.listen import Listener

        listener = Listener(Path(args.listen), args.idle_timeout)
    try:
        serve(Connection(args.fd) if args.fd is not None else None, args.device, Path(args.scratch_root),
              args.isolation, args.hide, Path(args.probe_cache) if args.probe_cache else None, args.concurrency,
              listener=listener, calibration_cache=Path(args.calibration_cache) if args.calibration_cache else None)
    finally:
        if listener is not None:
            listener.close()
        if args.owns_scratch:
            import shutil

            shutil.rmtree(args.scratch_root, ignore_errors=True)
    sys.exit(0)
