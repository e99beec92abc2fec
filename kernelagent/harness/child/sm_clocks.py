"""The SM clock through NVML (kernelagent/nvml.py), for the timer's throttling check
(child/timing.py): readings on about CLOCK_SAMPLES calls of a loop in the candidate's process
(`sm_clock_reader`), or from a thread of the server around that loop (`ClockSampler`), summed
up as the means of the first and last decile (`first_last_decile`). Without NVML nothing is
recorded and nothing fails."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch

from kernelagent.nvml import Nvml

# About this many SM clock readings per timed loop (each costs one NVML call, outside the timed
# region); the first and last decile of them are compared.
CLOCK_SAMPLES = 30

_perf_counter = time.perf_counter  # bound now, before any candidate code runs


def read_device(ids: dict[str, Any], read: Callable[[Nvml, Any], Any]) -> Any:
    """`read(nvml, handle)` on the device NVML names `ids` ("uuid", "pci_bus_id": a probe's
    fingerprint), NVML opened for it and closed after; None without NVML or that device."""
    with Nvml.session() as nvml:
        handle = nvml.handle(ids.get("uuid"), ids.get("pci_bus_id")) if nvml is not None else None
        return read(nvml, handle) if handle is not None else None


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
