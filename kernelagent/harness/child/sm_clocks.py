"""The SM clock through NVML (libnvidia-ml.so.1 through ctypes), for the timer's throttling check
(child/timing.py): readings on about CLOCK_SAMPLES calls of a loop in the candidate's process
(`sm_clock_reader`), or from a thread of the server around that loop (`ClockSampler`), summed
up as the means of the first and last decile (`first_last_decile`). Without NVML nothing is
recorded and nothing fails."""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any, Callable

import torch

# About this many SM clock readings per timed loop (each costs one NVML call, outside the timed
# region); the first and last decile of them are compared.
CLOCK_SAMPLES = 30

_perf_counter = time.perf_counter  # bound now, before any candidate code runs


# nvmlProcessInfo_v1_t and nvmlProcessInfo_t (v2/v3); NVML_VALUE_NOT_AVAILABLE as an unsigned long long.
_PROCESS_V1 = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]
_PROCESS_V2 = _PROCESS_V1 + [("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]
_NOT_AVAILABLE = (1 << 64) - 1


class Nvml:
    """The few NVML calls the timer needs (libnvidia-ml.so.1 through ctypes). `open` returns
    None where NVML is missing or does not initialise: then no clock is recorded, and nothing
    fails."""

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
        for name, fields in (("nvmlDeviceGetComputeRunningProcesses_v3", _PROCESS_V2),
                             ("nvmlDeviceGetComputeRunningProcesses_v2", _PROCESS_V2),
                             ("nvmlDeviceGetComputeRunningProcesses", _PROCESS_V1)):
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
                if 0 < item.usedGpuMemory < _NOT_AVAILABLE and 0 < item.pid < 1 << 31:
                    out[int(item.pid)] = out.get(int(item.pid), 0) + int(item.usedGpuMemory)
            return out
        return None

    def close(self) -> None:
        fn = getattr(self.lib, "nvmlShutdown", None)
        if fn is not None:
            fn()


def read_device(ids: dict[str, Any], read: Callable[[Nvml, Any], Any]) -> Any:
    """`read(nvml, handle)` on the device NVML names `ids` ("uuid", "pci_bus_id": a probe's
    fingerprint), NVML opened for it and closed after; None without NVML or that device."""
    nvml = Nvml.open()
    if nvml is None:
        return None
    try:
        handle = nvml.handle(ids.get("uuid"), ids.get("pci_bus_id"))
        return read(nvml, handle) if handle is not None else None
    finally:
        nvml.close()


def torch_device_ids(index: int) -> dict[str, str | None]:
    """NVML's names for CUDA device `index` as torch sees it: its UUID ("GPU-..." or "MIG-...")
    and PCI bus id ("dddddddd:bb:dd.0"). None where torch does not report one."""
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    text = str(uuid) if uuid is not None else None
    if text and not text.startswith(("GPU-", "MIG-")):
        text = "GPU-" + text
    pci = None
    if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        pci = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    return {"uuid": text, "pci_bus_id": pci}


_CLOCK_READER: dict[int, Any] = {}  # pid -> the SM clock reader of this process (or None)


def sm_clock_reader(device: torch.device) -> Callable[[], int | None] | None:
    """A function reading the SM clock (MHz) of `device` through NVML, opened once per process;
    None without NVML or a way to find the device. Keyed by pid: a forked child never reuses
    the state of its parent."""
    import os

    pid = os.getpid()
    if pid not in _CLOCK_READER:
        reader = None
        nvml = Nvml.open()
        if nvml is not None:
            try:
                ids = torch_device_ids(device.index if device.index is not None else torch.cuda.current_device())
                handle = nvml.handle(ids["uuid"], ids["pci_bus_id"])
            except Exception:  # noqa: BLE001 - no clocks rather than no evaluation
                handle = None
            if handle is not None:
                reader = lambda: nvml.sm_clock_mhz(handle)  # noqa: E731
            else:
                nvml.close()
        _CLOCK_READER.clear()
        _CLOCK_READER[pid] = reader
    return _CLOCK_READER[pid]


def first_last_decile(points: list[tuple[float, float]]) -> list[float] | None:
    """The mean value over the first and over the last tenth of a loop, from (position, value)
    points in order (position: a call index or a time); the first and last point always count.
    None with fewer than two points."""
    points = [(p, v) for p, v in points if v is not None]
    if len(points) < 2:
        return None
    lo, hi = points[0][0], points[-1][0]
    reach = 0.1 * (hi - lo)
    first = [v for p, v in points if p <= lo + reach]
    last = [v for p, v in points if p >= hi - reach]
    return [round(sum(first) / len(first), 1), round(sum(last) / len(last), 1)]


class ClockSampler:
    """SM clock readings from a thread, every `interval_s` between start() and stop(): for a
    loop that runs in another process (the server samples around the candidate's timed loop,
    so the candidate cannot touch the readings). The server has no CUDA context, and NVML is
    opened for the loop and shut down after it, so no forked job inherits an open NVML."""

    def __init__(self, read: Callable[[], int | None], interval_s: float, close: Callable[[], None] | None = None):
        self.read = read
        self.interval_s = interval_s
        self._close = close
        self.points: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kernelagent-clocks", daemon=True)
        self._started = False

    @classmethod
    def for_device(cls, uuid: str | None, pci_bus_id: str | None, expected_s: float) -> "ClockSampler | None":
        """About CLOCK_SAMPLES readings over a loop expected to take `expected_s` (one every
        1 to 50 ms). None without NVML or without the device in it."""
        nvml = Nvml.open()
        if nvml is None:
            return None
        handle = nvml.handle(uuid, pci_bus_id)
        if handle is None:
            nvml.close()
            return None
        interval = min(max(expected_s / CLOCK_SAMPLES, 0.001), 0.05)
        return cls(lambda: nvml.sm_clock_mhz(handle), interval, nvml.close)

    def _take(self) -> None:
        try:
            value = self.read()
        except Exception:  # noqa: BLE001
            value = None
        if value:
            self.points.append((_perf_counter(), float(value)))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take()

    def start(self) -> None:
        self._started = True
        self._take()
        self._thread.start()

    def stop(self) -> list[float] | None:
        """[first-decile mean, last-decile mean] in MHz, or None; closes NVML."""
        if self._started:
            self._stop.set()
            self._thread.join(1.0)
            if self._thread.is_alive():  # a reading hangs: leave NVML open rather than pull it away
                self._close = None
        if self._close is not None:
            self._close()
            self._close = None
        return first_last_decile(self.points)
