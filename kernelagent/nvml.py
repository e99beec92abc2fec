"""NVML (libnvidia-ml.so.1) through ctypes, with no torch and no CUDA context: the few calls the
timer's clock readings (harness/child/sm_clocks.py), the server's memory and process readings and
the CLI's device check (devices.py) need. `Nvml.open` returns None where NVML is missing or does
not initialise, and nothing fails."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# nvmlProcessInfo_v1_t and nvmlProcessInfo_t (v2/v3); NVML_VALUE_NOT_AVAILABLE as an unsigned long long.
PROCESS_V1 = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]
PROCESS_V2 = PROCESS_V1 + [("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]
NOT_AVAILABLE = (1 << 64) - 1


class Nvml:
    """The few NVML calls the harness and the CLI need. `open` returns None where NVML is missing
    or does not initialise: then no clock is recorded, the CLI asks nvidia-smi, and nothing fails."""

    CLOCK_SM = 1  # NVML_CLOCK_SM

    def __init__(self, lib: Any):
        self.lib = lib

    @classmethod
    def open(cls, name: str = "libnvidia-ml.so.1") -> "Nvml | None":
        try:
            lib = ctypes.CDLL(name)
            init = getattr(lib, "nvmlInit_v2", None) or lib.nvmlInit
            init.restype = ctypes.c_int
            if init() != 0:
                return None
            lib.nvmlDeviceGetClockInfo.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint)]
            lib.nvmlDeviceGetClockInfo.restype = ctypes.c_int
        except (OSError, AttributeError):
            return None
        return cls(lib)

    @classmethod
    @contextmanager
    def session(cls) -> Iterator["Nvml | None"]:
        """NVML opened for a `with` block and shut down after it; None inside where `open` is."""
        nvml = cls.open()
        try:
            yield nvml
        finally:
            if nvml is not None:
                nvml.close()

    def handle(self, uuid: str | None = None, pci_bus_id: str | None = None) -> Any:
        """The NVML device of a CUDA device, by UUID, else by PCI bus id: never by index, since
        CUDA_VISIBLE_DEVICES (or CUDA's own ordering) can make CUDA's index 0 another NVML index."""
        for name, key in (("nvmlDeviceGetHandleByUUID", uuid),
                          ("nvmlDeviceGetHandleByPciBusId_v2", pci_bus_id),
                          ("nvmlDeviceGetHandleByPciBusId", pci_bus_id)):
            fn = getattr(self.lib, name, None)
            if fn is None or not key:
                continue
            fn.argtypes, fn.restype = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)], ctypes.c_int
            handle = ctypes.c_void_p()
            if fn(key.encode(), ctypes.byref(handle)) == 0 and handle.value:
                return handle
        return None

    def sm_clock_mhz(self, handle: Any) -> int | None:
        value = ctypes.c_uint(0)
        if self.lib.nvmlDeviceGetClockInfo(handle, self.CLOCK_SM, ctypes.byref(value)) != 0:
            return None
        return int(value.value) or None

    def memory_info(self, handle: ctypes.c_void_p) -> tuple[int, int, int] | None:
        """The device's (total, free, used) memory (nvmlDeviceGetMemoryInfo), without a CUDA context."""

        class _Memory(ctypes.Structure):
            _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

        info = _Memory()
        fn = self.lib.nvmlDeviceGetMemoryInfo
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.POINTER(_Memory)], ctypes.c_int
        return (int(info.total), int(info.free), int(info.used)) if fn(handle, ctypes.byref(info)) == 0 else None

    def free_bytes(self, handle: Any) -> int | None:
        """Free device memory, without a CUDA context."""
        info = self.memory_info(handle)
        return info[1] if info is not None else None

    def process_bytes(self, handle: Any, limit: int = 256) -> dict[int, int] | None:
        """Device memory each compute process holds on this device (nvmlDeviceGetComputeRunning
        Processes, v3, v2 or v1), by pid as this process's namespace sees it; None where NVML
        cannot say. Entries whose size NVML does not know are left out."""
        for name, fields in (("nvmlDeviceGetComputeRunningProcesses_v3", PROCESS_V2),
                             ("nvmlDeviceGetComputeRunningProcesses_v2", PROCESS_V2),
                             ("nvmlDeviceGetComputeRunningProcesses", PROCESS_V1)):
            fn = getattr(self.lib, name, None)
            if fn is None:
                continue
            row = type("_Process", (ctypes.Structure,), {"_fields_": fields})
            count = ctypes.c_uint(limit)
            rows = (row * limit)()
            fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(row)]
            fn.restype = ctypes.c_int
            if fn(handle, ctypes.byref(count), rows) != 0:
                return None
            out: dict[int, int] = {}
            for item in rows[:min(int(count.value), limit)]:
                if 0 < item.usedGpuMemory < NOT_AVAILABLE and 0 < item.pid < 1 << 31:
                    out[int(item.pid)] = out.get(int(item.pid), 0) + int(item.usedGpuMemory)
            return out
        return None

    def device_count(self) -> int | None:
        """How many devices NVML numbers (as `nvidia-smi` does), or None where it cannot say; a
        count over 4096 is no answer."""
        fn = getattr(self.lib, "nvmlDeviceGetCount_v2", None) or getattr(self.lib, "nvmlDeviceGetCount", None)
        if fn is None:
            return None
        fn.restype = ctypes.c_int
        count = ctypes.c_uint(0)
        if fn(ctypes.byref(count)) != 0 or count.value > 4096:
            return None
        return int(count.value)

    def close(self) -> None:
        fn = getattr(self.lib, "nvmlShutdown", None)
        if fn is not None:
            fn()
