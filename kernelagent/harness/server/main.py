"""The harness server: a pre-imported process that runs several jobs at once on one device.

Started by the caller (caller/evaluator.py) as `python -m kernelagent.harness.server`, with a
scrubbed environment, pinned to one device. It imports torch and Triton once and never initialises
CUDA itself, so forking a fresh pair of processes per job costs milliseconds. Messages to and from
the caller are typed JSON (protocol.py), each carrying the job id and the caller's secret nonce;
several jobs share the socket, one thread each (`Dispatcher`), their timed phases serialised by
the device's gate (server/gate.py).

Start-up: torch and torch._dynamo are imported once here (every job is forked warm), while the
device probe runs in a throwaway child; its answer is cached per machine boot, driver, device and
library versions (`--probe-cache`), with free memory read afresh through NVML.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Callable

import torch

from kernelagent import settings
from kernelagent.harness import protocol, verdict
from kernelagent.harness.config import COMPILE_WORKERS_ENV, EvalConfig
from kernelagent.harness.server import gate as gate_mod
from kernelagent.harness.server.admission import Admission
from kernelagent.harness.server.device_lock import DeviceLock
from kernelagent.harness.server.job import Job
from kernelagent.harness.server.processes import FORK, kill_group
from kernelagent.harness.server.record_types import DeviceLockInfo

def probe_device(requested: str) -> dict[str, Any]:
    """Runs in a throwaway child: what device is there? (keeps CUDA out of the server)."""
    import platform

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "platform": platform.platform(),
        "cuda": False,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # noqa: BLE001 - triton is optional for the reference side
        info["triton"] = None
    if requested != "cpu" and torch.cuda.is_available():
        index = torch.device(requested).index or 0 if requested.startswith("cuda") else 0
        from kernelagent import hardware

        info.update(cuda=True, device=f"cuda:{index}", **hardware.torch_device_facts(index))
        info.update(probe_timer(index, info.get("l2_bytes")))
        # Free memory before any job (this probe's own context aside): what one evaluation's two
        # processes can share. The reference process checks a problem's estimate against it.
        info["free_bytes"] = int(torch.cuda.mem_get_info(index)[0])
        try:
            import subprocess

            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            info["driver"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else None
        except Exception:  # noqa: BLE001
            info["driver"] = None
    else:
        info["device"] = "cpu"
    return info


def probe_timer(index: int, l2_bytes: int | None) -> dict[str, Any]:
    """Once per server, in the probe's child (child/timing.py): does the timer's L2 flush evict
    (`l2_flush`), can persisting L2 be reset (`l2_reset`, and the microseconds one reset costs), is
    NVML there and how long it takes to start (`nvml`), and NVML's names for the device (`uuid`,
    `pci_bus_id`: the server reads the clock by these, never by index). Never raises."""
    import time

    from kernelagent import hardware
    from kernelagent.harness.child import sm_clocks, timing

    out: dict[str, Any] = {}
    try:
        out.update(sm_clocks.torch_device_ids(index))
    except Exception as exc:  # noqa: BLE001
        out["uuid"] = out["pci_bus_id"] = None
        out["device_ids_error"] = str(exc)[:200]
    try:
        device = torch.device(f"cuda:{index}")
        torch.cuda.set_device(device)
        l2 = int(l2_bytes) if l2_bytes else None
        timer = timing.Timer(device, flush_bytes=2 * l2 if l2 else hardware.DEFAULT_L2_FLUSH_BYTES,
                             launch_cover_us=EvalConfig.launch_cover_us)
        out["l2_flush"] = timer.check_flush(l2 or hardware.DEFAULT_L2_FLUSH_BYTES // 2)
        started = time.perf_counter()
        for _ in range(100):
            timer.persisting()
        out["l2_reset"] = timer.l2_reset
        out["l2_reset_us"] = round((time.perf_counter() - started) * 1e4, 2)
        del timer
    except Exception as exc:  # noqa: BLE001 - the evaluations still run; the result says why
        out.setdefault("l2_flush", {"evicts": None, "note": f"the flush check failed: {str(exc)[:200]}"})
        out.setdefault("l2_reset", f"could not reset: the probe failed ({str(exc)[:200]})")
    started = time.perf_counter()
    nvml = sm_clocks.Nvml.open()
    init_ms = (time.perf_counter() - started) * 1e3
    if nvml is None:
        out["nvml"] = {"available": False}
    else:
        handle = nvml.handle(out.get("uuid"), out.get("pci_bus_id"))
        clock = nvml.sm_clock_mhz(handle) if handle is not None else None
        started = time.perf_counter()
        for _ in range(20):
            if handle is not None:
                nvml.sm_clock_mhz(handle)
        out["nvml"] = {"available": handle is not None, "init_ms": round(init_ms, 2), "sm_clock_mhz": clock,
                       "read_us": round((time.perf_counter() - started) * 5e4, 2) if handle is not None else None}
        nvml.close()
    return out


def _start_probe(requested: str) -> tuple[BaseProcess, Connection]:
    """probe_device in a throwaway child, so CUDA is never initialised in the server (a forked
    child of a process with CUDA cannot use it). The answer comes back as JSON (_finish_probe)."""
    parent_end, child_end = FORK.Pipe()

    def target() -> None:
        try:
            from kernelagent.harness import procname

            procname.set_name("ka-probe")
            info = probe_device(requested)
        except BaseException as exc:  # noqa: BLE001
            info = {"error": "".join(traceback.format_exception_only(type(exc), exc)).strip()}
        child_end.send_bytes(json.dumps(protocol.json_safe(info)).encode())
        os._exit(0)

    proc = FORK.Process(target=target)
    proc.start()
    child_end.close()
    return proc, parent_end


def _finish_probe(proc: BaseProcess, parent_end: Connection) -> dict[str, Any]:
    try:
        info = json.loads(parent_end.recv_bytes(1 << 20)) if parent_end.poll(120) else \
            {"error": "device probe timed out"}
    except (EOFError, OSError, ValueError):
        info = {"error": "the device probe died"}
    proc.join(5)
    return info


def _probe_in_child(requested: str) -> dict[str, Any]:
    return _finish_probe(*_start_probe(requested))


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


def serve(conn: Connection | None, requested_device: str, scratch_root: Path, isolation: str,
          hide: list[str] | None = None, probe_cache: Path | None = None, concurrency: int = 0,
          listener: Any = None, calibration_cache: Path | None = None) -> None:
    """Set up once (the probe, the imports, the jail), then serve `conn` (the caller that started
    this server), or with `listener` (server/listen.py: a warm harness that outlives one command)
    every connection of this user, jobs of all of them sharing the device's gate."""
    probe = cached_probe(requested_device, probe_cache)
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
    _import_once(expects_cuda=expects_cuda)
    # Every module of ours a job's thread or forked child imports lazily, now, before any job
    # thread exists: a fork while another thread is mid-import leaves that module locked for
    # ever in the child (server/forking.py).
    from kernelagent.harness.server import forking

    for failure in forking.preload():
        print(f"kernelagent harness: preload: {failure}", file=sys.stderr, flush=True)
    if fingerprint is None:
        fingerprint = probe()
        if bool(fingerprint.get("cuda")) != expects_cuda and not known:
            _restart_knowing(bool(fingerprint.get("cuda")))
    # The kernel tracer (issue 55), built on first use: its jobs' processes are traced where it loads.
    from kernelagent.harness.trace import build as trace_build

    fingerprint["trace"] = trace_build.for_server(cuda=bool(fingerprint.get("cuda")))
    from kernelagent.harness.jail import candidate as jail

    sandbox = jail.resolve(isolation, scratch_root, hide)
    fingerprint["isolation"] = sandbox["describe"]
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


def share_compile_workers(jobs: int) -> int:
    """Inductor's compile workers for each reference process that compiles baselines: this
    server's CPUs shared among the jobs it runs at once, at least one. Inductor's own default is
    min(32, CPUs) per process, and a cold server's reference processes compiling at once with it
    ran honest jobs past their 'start' or 'compile' limits (docs/concepts/concurrency.md,
    "Inductor's compile workers"). Set in the environment the job processes are forked with
    (child/reference_side.py set_compile_workers); TORCHINDUCTOR_COMPILE_THREADS, where the
    caller set it, wins."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    workers = max(1, cpus // max(1, int(jobs)))
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
            with self.admission.admit(alone=alone) as device_lock:
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


def cached_probe(requested: str, cache_dir: Path | None) -> Callable[[], dict[str, Any]]:
    """The device probe's answer, as a function to call for it: from `cache_dir` when this
    machine boot, driver, device and library versions were probed before (free memory read
    afresh through NVML), else probed in a throwaway child started now (so the caller can import
    meanwhile) and written there. `probe_cached` says which."""
    key = _probe_key(requested)
    path = cache_dir / f"{key}.json" if cache_dir is not None and key else None
    if path is not None and path.is_file() and not path.is_symlink():
        try:
            info = json.loads(path.read_text())
            free = _nvml_free_bytes(info) if info.get("cuda") else None
            if not info.get("cuda") or free is not None:
                if free is not None:
                    info["free_bytes"] = free
                info["probe_cached"] = True

                def cached() -> dict[str, Any]:
                    return info

                cached.cached = True  # type: ignore[attr-defined]
                return cached
        except (OSError, ValueError):
            pass
    pending = _start_probe(requested)

    def finish() -> dict[str, Any]:
        info = _finish_probe(*pending)
        info["probe_cached"] = False
        if path is not None and "error" not in info:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(protocol.json_safe(info)))
                os.replace(tmp, path)
            except OSError:
                pass
        return info

    return finish


def _probe_key(requested: str) -> str | None:
    """What a probe's answer depends on: the boot (a new one may bring new clocks or a new
    driver), the driver, the visible devices, the libraries and the timer's settings."""
    parts = [requested, os.environ.get("CUDA_VISIBLE_DEVICES", "<all>"), sys.executable, torch.__version__,
             str(EvalConfig.launch_cover_us)]
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/driver/nvidia/version"):
        try:
            parts.append(Path(path).read_text().strip())
        except OSError:
            parts.append("-")
    try:
        from importlib.metadata import version

        parts.append(version("triton"))
    except Exception:  # noqa: BLE001
        parts.append("-")
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:24]


def _nvml_free_bytes(info: dict[str, Any]) -> int | None:
    from kernelagent.harness.child.sm_clocks import read_device

    return read_device(info, lambda nvml, handle: nvml.free_bytes(handle))


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
