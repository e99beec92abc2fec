"""Which devices exist, asked without initialising CUDA in this process.

The CLI checks a requested device here before anything starts, so that `--device cuda:7`
(or `--gpus 7`) on a machine without that GPU is one line and exit 2 instead of a run that
silently lands on the CPU. Only `auto` may choose the CPU, and it says so on stderr.

Sources, in order: CUDA_VISIBLE_DEVICES (what the harness processes would inherit), NVML's
device count (libnvidia-ml through ctypes, the library `nvidia-smi` reads, in this process: no
CUDA context, and no `nvidia-smi` process, which a warm `eval` paid twice per command), then
`nvidia-smi`, then the driver's /proc/driver/nvidia/gpus. Indices are the physical ones, as
`Evaluator(device="cuda:N")` and `bench --gpus` use them (they pin CUDA_VISIBLE_DEVICES=N); NVML
numbers them as `nvidia-smi` does. The machine's answer is asked once per process.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from kernelagent.errors import UserError
from kernelagent.nvml import Nvml

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
CPU_NOTE = "note: no GPU found: running on the CPU under the Triton interpreter (timings are not meaningful)"


def first_visible_device(environ: Mapping[str, str] | None = None) -> str | None:
    """What CUDA_VISIBLE_DEVICES narrows to for a process that uses CUDA's first device only (a
    job's processes and its evidence session use cuda:0): the first entry of the list, or "0"
    where it is unset; None where it already names one device or none. CUDA counts the entries in
    its own order, so the first entry is the device that was cuda:0. The driver makes a context
    for a process that sees one GPU sooner than for one that sees two (0.37 s against 0.56 s on two
    H200s, scripts/device/driver_contention.py), and under its host-wide lock; and the job's
    processes then see no other GPU, where another server may be timing."""
    value = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return "0"
    parts = _visible_entries(value)
    return parts[0] if len(parts) > 1 and parts[0] != "-1" else None


def _visible_entries(value: str) -> list[str]:
    """CUDA_VISIBLE_DEVICES's entries, in order, blanks dropped."""
    return [p.strip() for p in value.split(",") if p.strip()]


def gpu_indices() -> list[int] | None:
    """Physical indices of the GPUs this process may use; None when that cannot be told
    (CUDA_VISIBLE_DEVICES names GPUs by UUID or MIG instance)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        parts = _visible_entries(env)
        if not parts or parts[0] == "-1":
            return []
        if not all(p.isdigit() for p in parts):
            return None
        return [int(p) for p in parts]
    return list(_machine_gpus())


@functools.cache
def _machine_gpus() -> tuple[int, ...]:
    """The GPUs of this machine, asked once per process: NVML's count, else nvidia-smi's indices,
    else the driver's /proc."""
    count = nvml_device_count()
    if count is not None:
        return tuple(range(count))
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            if out.returncode == 0:
                return tuple(int(line) for line in out.stdout.split() if line.strip().isdigit())
        except (OSError, subprocess.TimeoutExpired):
            pass
    proc = Path("/proc/driver/nvidia/gpus")
    try:
        return tuple(range(sum(1 for _ in proc.iterdir()))) if proc.is_dir() else ()
    except OSError:
        return ()


def nvml_device_count() -> int | None:
    """NVML's device count (kernelagent/nvml.py), NVML opened for it and closed after; None where
    the library is missing or does not answer."""
    with Nvml.session() as nvml:
        return nvml.device_count() if nvml is not None else None


def _describe(gpus: list[int]) -> str:
    return f"visible GPUs: {','.join(map(str, gpus))}" if gpus else "this machine has no visible GPU"


def check_device(device: str, option: str = "--device", quiet: bool = False) -> str:
    """Validate a device option; returns it normalised. An explicit GPU that does not exist
    is a UserError (exit 2). `auto` with no GPU prints one note on stderr (unless quiet)."""
    value = (device or "auto").strip().lower()
    if not DEVICE_PATTERN.fullmatch(value):
        raise UserError(f"{option} must be auto, cpu, cuda or cuda:N (got {device!r})")
    if value == "cpu":
        return value
    gpus = gpu_indices()
    if value == "auto":
        if gpus == [] and not quiet:
            print(CPU_NOTE, file=sys.stderr, flush=True)
        return value
    if gpus is None:  # named by UUID: CUDA decides in the harness
        return value
    if not gpus:
        raise UserError(f"{option} {device}: {_describe(gpus)} (use --device cpu or auto)")
    if value.startswith("cuda:") and int(value[5:]) not in gpus:
        raise UserError(f"{option} {device}: no such GPU ({_describe(gpus)})")
    return value


def check_gpu_list(spec: str | None, option: str = "--gpus", quiet: bool = False) -> None:
    """`--gpus 0,1` / `cpu` / `all` / None: every index named must exist; all (or None)
    with no GPU falls back to the CPU and says so."""
    text = (spec or "").strip().lower()
    if text == "cpu":
        return
    if text in ("", "all"):
        check_device("auto", option, quiet=quiet)
        return
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise UserError(f"{option} takes GPU indices like 0,1 (or cpu / all), got {spec!r}")
    gpus = gpu_indices()
    if gpus is None:  # named by UUID: CUDA decides in the harness
        return
    missing = [p for p in parts if int(p) not in gpus]
    if missing:
        raise UserError(f"{option} {spec}: no GPU {','.join(missing)} ({_describe(gpus)}; use --gpus cpu)")
