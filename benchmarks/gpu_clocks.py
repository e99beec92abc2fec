"""GPU clocks, temperature, power and throttle reasons around a benchmark's evaluations: NVML
(pynvml, else ctypes on libnvidia-ml.so.1, which the GPU machines have without pynvml), else
nvidia-smi. Used by benchmarks/fidelity.py."""

from __future__ import annotations

import shutil
import subprocess

CLOCK_FIELDS = ("clocks.sm", "clocks.max.sm", "temperature.gpu", "power.draw")


class _Nvml:
    """NVML through pynvml when it is installed, else through ctypes on libnvidia-ml.so.1 (the GPU
    machines have the driver's library but not pynvml); `None` from `open()` where neither loads."""

    CLOCK_SM, TEMPERATURE_GPU = 1, 0

    def __init__(self, lib, via: str):
        self.lib, self.via = lib, via

    @classmethod
    def open(cls) -> "_Nvml | None":
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            return cls(pynvml, "pynvml")
        except Exception:  # noqa: BLE001 - absent or unusable: try the library itself
            pass
        import ctypes

        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            init = getattr(lib, "nvmlInit_v2", None) or lib.nvmlInit
            if init() != 0:
                return None
        except (OSError, AttributeError):
            return None
        return cls(lib, "ctypes:libnvidia-ml.so.1")

    def read(self, index: int) -> dict:
        """SM clock and its maximum (MHz), temperature (C), power (W), throttle reasons (bit mask)."""
        if self.via == "pynvml":
            n = self.lib
            handle = n.nvmlDeviceGetHandleByIndex(index)
            values = {"clocks.sm": n.nvmlDeviceGetClockInfo(handle, self.CLOCK_SM),
                      "clocks.max.sm": n.nvmlDeviceGetMaxClockInfo(handle, self.CLOCK_SM),
                      "temperature.gpu": n.nvmlDeviceGetTemperature(handle, self.TEMPERATURE_GPU),
                      "power.draw": n.nvmlDeviceGetPowerUsage(handle) / 1000.0}
            try:
                values["throttle_reasons"] = int(n.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
            except Exception:  # noqa: BLE001
                values["throttle_reasons"] = None
            return values
        import ctypes

        lib = self.lib
        handle = ctypes.c_void_p()
        get = getattr(lib, "nvmlDeviceGetHandleByIndex_v2", None) or lib.nvmlDeviceGetHandleByIndex
        if get(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
            return {"error": f"NVML has no device {index}"}
        out: dict = {}

        def uint(name: str, fn, *args) -> None:
            value = ctypes.c_uint()
            out[name] = float(value.value) if fn(handle, *args, ctypes.byref(value)) == 0 else None

        uint("clocks.sm", lib.nvmlDeviceGetClockInfo, ctypes.c_int(self.CLOCK_SM))
        uint("clocks.max.sm", lib.nvmlDeviceGetMaxClockInfo, ctypes.c_int(self.CLOCK_SM))
        uint("temperature.gpu", lib.nvmlDeviceGetTemperature, ctypes.c_int(self.TEMPERATURE_GPU))
        uint("power.draw", lib.nvmlDeviceGetPowerUsage)
        if out.get("power.draw") is not None:
            out["power.draw"] /= 1000.0  # mW -> W
        reasons = ctypes.c_ulonglong()
        fn = getattr(lib, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        out["throttle_reasons"] = int(reasons.value) if fn is not None and fn(handle, ctypes.byref(reasons)) == 0 \
            else None
        return out


_NVML: list = []  # opened once: [handle or None]


def nvml() -> "_Nvml | None":
    if not _NVML:
        _NVML.append(_Nvml.open())
    return _NVML[0]


def read_clocks(gpu_index: str | None) -> dict | None:
    """SM clock (MHz), its maximum, temperature (C), power (W): from NVML (pynvml, else ctypes on
    libnvidia-ml.so.1; with the throttle reasons), else from nvidia-smi; None without either.
    `source` says which. The index is NVML's, which follows CUDA_VISIBLE_DEVICES only when the
    machine's order matches it."""
    lib = nvml() if gpu_index is not None else None
    if lib is not None:
        try:
            values = lib.read(int(gpu_index))
            values["source"] = f"NVML ({lib.via})"
            return values
        except Exception as exc:  # noqa: BLE001 - fall back to nvidia-smi
            nvml_error = f"NVML failed: {exc}"
    else:
        nvml_error = None
    if shutil.which("nvidia-smi") is None:
        return {"error": nvml_error} if nvml_error else None
    cmd = ["nvidia-smi", f"--query-gpu={','.join(CLOCK_FIELDS)}", "--format=csv,noheader,nounits"]
    if gpu_index is not None:
        cmd += ["-i", gpu_index]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return {"error": "nvidia-smi failed"}
    if not out:
        return {"error": "nvidia-smi printed nothing"}
    values: dict = {"source": "nvidia-smi"}
    for name, raw in zip(CLOCK_FIELDS, out[0].split(",")):
        try:
            values[name] = float(raw.strip())
        except ValueError:  # "[N/A]" on some boards
            values[name] = None
    return values


def gpu_index(device: str) -> str | None:
    """The GPU whose clocks are read: cuda:N -> N; cuda and auto -> the first visible one (None for
    the CPU; on a machine without a GPU nothing is read anyway)."""
    if device.startswith("cuda:"):
        return device.split(":", 1)[1]
    if device in ("cuda", "auto"):
        import os

        first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip()
        return first if first.isdigit() else "0"
    return None
