"""The harness server: a pre-imported process that runs one job at a time.

Started by the caller (caller/evaluator.py) as `python -m kernelagent.harness.server`, with a
scrubbed environment, pinned to one device. It imports torch and Triton once and never initialises
CUDA itself, so forking a fresh pair of processes per job costs milliseconds rather than the seconds
of a fresh interpreter. Messages to and from the caller are typed JSON (protocol.py), each carrying
the job id and the caller's secret nonce.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from kernelagent.harness import protocol
from kernelagent.harness.config import EvalConfig
from kernelagent.harness.result import Status
from kernelagent.harness.server.job import FORK, Job

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
    from kernelagent.harness.child import timing

    out: dict[str, Any] = {}
    try:
        out.update(timing.torch_device_ids(index))
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
    nvml = timing.Nvml.open()
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


def _probe_in_child(requested: str) -> dict[str, Any]:
    """probe_device in a throwaway child, so CUDA is never initialised in the server (a forked
    child of a process with CUDA cannot use it). The answer comes back as JSON."""
    import json

    parent_end, child_end = FORK.Pipe()

    def target() -> None:
        try:
            info = probe_device(requested)
        except BaseException as exc:  # noqa: BLE001
            info = {"error": "".join(traceback.format_exception_only(type(exc), exc)).strip()}
        child_end.send_bytes(json.dumps(protocol.json_safe(info)).encode())
        os._exit(0)

    proc = FORK.Process(target=target)
    proc.start()
    child_end.close()
    try:
        info = json.loads(parent_end.recv_bytes(1 << 20)) if parent_end.poll(120) else \
            {"error": "device probe timed out"}
    except (EOFError, OSError, ValueError):
        info = {"error": "the device probe died"}
    proc.join(5)
    return info


def serve(conn: Connection, requested_device: str, scratch_root: Path, isolation: str,
          hide: list[str] | None = None) -> None:
    fingerprint = _probe_in_child(requested_device)
    if not fingerprint.get("cuda"):
        # No GPU: Triton kernels run under the interpreter, on CPU tensors.
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton  # noqa: F401 - pre-import once, so each fork starts warm
    except ImportError:
        pass
    try:
        # Imported lazily by torch otherwise, at which point it rebinds torch.manual_seed and
        # friends inside the candidate's process (the tampering check would see it).
        import torch._dynamo  # noqa: F401
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    from kernelagent.harness.child import jail

    sandbox = jail.resolve(isolation, scratch_root, hide)
    fingerprint["isolation"] = sandbox["describe"]
    protocol.send(conn, "hello", "-", fingerprint=protocol.json_safe(fingerprint), pid=os.getpid())
    while True:
        try:
            request = protocol.recv(conn, {"evaluate", "shutdown"}, max_bytes=protocol.MAX_CALLER_FRAME)
        except (EOFError, OSError):
            return
        if request["type"] == "shutdown":
            return
        job_id = str(request["job"])
        cpu_before = _cpu_seconds()
        job = Job(request, scratch_root, fingerprint, sandbox)
        try:
            job.fork()
        except Exception:  # noqa: BLE001
            job.result.update(status=Status.HARNESS_ERROR, reason="harness error:\n" + traceback.format_exc(limit=4))
        protocol.send(conn, "started", job_id)
        # The job's nonce arrives only now: the job's processes were forked without it.
        try:
            nonce = protocol.recv(conn, {"nonce"}, job_id)["nonce"]
        except (EOFError, OSError):
            job.result["status"] = job.result["status"] or Status.HARNESS_ERROR
            return
        if job.result["status"] is None:
            try:
                result = job.run()
            except Exception:  # noqa: BLE001
                result = {"status": Status.HARNESS_ERROR, "reason": "harness error:\n" + traceback.format_exc()}
        else:
            result = job.result
        if isinstance(result.get("stage_seconds"), dict):
            # Host CPU the job cost: this server's and its reaped job processes' (a profile of
            # where a busy host's time goes; bench_throughput.py sums it).
            result["stage_seconds"]["server_cpu"] = round(_cpu_seconds() - cpu_before, 3)
        protocol.send(conn, "result", job_id, nonce, result=protocol.json_safe(result))


def _cpu_seconds() -> float:
    import resource

    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="kernelagent harness server (started by Evaluator)")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--scratch-root", required=True)
    parser.add_argument("--isolation", default="auto")
    parser.add_argument("--hide", action="append", default=[], help="a directory jobs must not see (repeatable)")
    # Applied by __main__.py before torch is imported; accepted here so the command line parses.
    parser.add_argument("--cpus", default=None, help="comma-separated CPUs this server and its jobs run on")
    args = parser.parse_args(argv)
    # No PR_SET_PDEATHSIG here: it fires when the *thread* that started us exits, which
    # kills servers started from short-lived worker threads. We exit when the caller's
    # socket closes (recv raises EOFError), and jobs are bounded by their stage timeouts.
    conn = Connection(args.fd)
    serve(conn, args.device, Path(args.scratch_root), args.isolation, args.hide)
    sys.exit(0)
