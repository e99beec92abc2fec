"""The device probe of a server's start (server/main.py serve): what device is there, its timer's
traps (does the L2 flush evict, can persisting L2 be reset, NVML), in a throwaway child so that
CUDA is never initialised in the server; its answer cached per machine boot, driver, device and
library versions (`cached_probe`), free memory read afresh through NVML."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import traceback
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Callable

import torch

from kernelagent.harness import protocol
from kernelagent.harness.config import EvalConfig
from kernelagent.harness.server.processes import FORK


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
