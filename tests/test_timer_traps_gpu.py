"""Timer traps on a real GPU (issue 13, scope 4-5). Run on the device machine:

    python -m pytest -m gpu -s tests/test_timer_traps_gpu.py

`-s` shows the measured numbers (flush check, reset and NVML costs, clocks, empty calls)."""

from __future__ import annotations

import ctypes
import time

import pytest

from kernelagent.harness import EvalConfig, Status
from kernelagent.harness.child import timing, transfer
from tests.conftest import CANDIDATES, read

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    device = torch.device("cuda:0")
    torch.cuda.set_device(device)
    return device


def _l2_bytes(device) -> int:
    import torch

    return int(torch.cuda.get_device_properties(device).L2_cache_size)


class Window(ctypes.Structure):
    """CUaccessPolicyWindow, padded to the 64 bytes of CUstreamAttrValue."""

    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hitRatio", ctypes.c_float),
                ("hitProp", ctypes.c_int), ("missProp", ctypes.c_int), ("pad", ctypes.c_char * 36)]


def test_persisting_l2_is_reset_before_each_call(cuda):
    import torch

    lib = transfer.libcuda()
    timer = timing.Timer(cuda, flush_bytes=2 * _l2_bytes(cuda))
    data = torch.ones(1 << 20, device=cuda)
    # What a kernel could leave behind: a persisting carve-out and a persisting window on the stream.
    assert lib.cuCtxSetLimit(ctypes.c_int(0x06), ctypes.c_size_t(4 << 20)) == 0
    window = Window(ctypes.c_void_p(data.data_ptr()), 4 << 20, 1.0, 2, 1)  # hit: persisting, miss: streaming
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    assert lib.cuStreamSetAttribute(stream, 1, ctypes.addressof(window)) == 0  # argtypes: the Timer bound them
    timer._one(lambda: data.sum(), [])
    limit = ctypes.c_size_t(123)
    assert lib.cuCtxGetLimit(ctypes.byref(limit), ctypes.c_int(0x06)) == 0
    after = Window()
    assert lib.cuStreamGetAttribute(stream, ctypes.c_int(1), ctypes.byref(after)) == 0
    started = time.perf_counter()
    for _ in range(200):
        timer.persisting()
    cost_us = (time.perf_counter() - started) * 1e6 / 200
    print(f"\nl2_reset={timer.l2_reset!r} carve-out removed={timer.persisting.carveout_removed} B, "
          f"limit now {limit.value} B, window now {after.num_bytes} B; one reset {cost_us:.1f} us")
    assert timer.l2_reset == "ok"
    assert timer.persisting.carveout_removed > 0 and limit.value == 0
    assert after.num_bytes == 0


def test_flush_check_evicts_and_can_fail(cuda):
    l2 = _l2_bytes(cuda)
    # With the launch cover, as the server's probe runs it: without one each ~10 us read timed
    # mostly its own launch (26-29 us cold and warm alike on an H100), and the rule read
    # "does not evict" in a fresh process too.
    cover = EvalConfig().launch_cover_us
    flushed = timing.Timer(cuda, flush_bytes=2 * l2, launch_cover_us=cover).check_flush(l2)
    # A flush buffer of 1 MiB cannot evict a quarter of L2: the same rule must say so.
    tiny = timing.Timer(cuda, flush_bytes=1 << 20, launch_cover_us=cover).check_flush(l2)
    off = timing.Timer(cuda, flush_bytes=2 * l2, flush_l2=False, launch_cover_us=cover).check_flush(l2)
    print(f"\nflush 2x L2: {flushed}\nflush 1 MiB: {tiny}\nflush off: {off}")
    assert flushed["evicts"] is True and flushed["cold_ms"] > flushed["warm_ms"]
    assert tiny["evicts"] is False
    assert off["evicts"] is False


def test_nvml_clock_over_a_timed_loop(cuda):
    import torch

    read_clock = timing.sm_clock_reader(cuda)
    if read_clock is None:
        pytest.skip("no NVML on this machine (libnvidia-ml.so.1) or the device is not found in it")
    started = time.perf_counter()
    readings = [read_clock() for _ in range(50)]
    cost_us = (time.perf_counter() - started) * 1e6 / 50
    timer = timing.Timer(cuda, flush_bytes=2 * _l2_bytes(cuda))
    a = torch.randn(4096, 4096, device=cuda)
    report = timer.measure(lambda x: x @ x, [[a]], 25.0, 300.0, 5, 1000, budget_s=30)
    print(f"\nSM clock {readings[0]} MHz, one NVML read {cost_us:.1f} us; 4096^2 fp32 matmul: "
          f"{report.timing.median_ms:.3f} ms, {report.timing.reps} reps, clocks first/last decile "
          f"{report.timing.clocks_mhz}")
    assert all(100 <= r <= 4000 for r in readings if r)
    assert len(report.timing.clocks_mhz) == 2 and all(100 <= c <= 4000 for c in report.timing.clocks_mhz)


def test_evaluation_records_the_traps(cuda_evaluator):
    fingerprint = cuda_evaluator.fingerprint()
    result = cuda_evaluator.evaluate(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"),
                                     EvalConfig(trials=2, use_baseline_cache=False))
    print(f"\nprobe: l2_flush={fingerprint.get('l2_flush')} l2_reset={fingerprint.get('l2_reset')} "
          f"({fingerprint.get('l2_reset_us')} us) nvml={fingerprint.get('nvml')} uuid={fingerprint.get('uuid')} "
          f"pci={fingerprint.get('pci_bus_id')}")
    print("timings: " + "; ".join(f"{k} {t.median_ms:.4f} ms empty={t.empty_call_ms} clocks={t.clocks_mhz} "
                                  f"note={t.note!r}" for k, t in result.timings.items()))
    print("baseline_overhead_ms:", result.baseline_overhead_ms)
    print("flags:", [(f.kind, f.message[:120]) for f in result.flags])
    assert result.status == Status.CORRECT, result.feedback()
    assert fingerprint["l2_flush"]["evicts"] is True
    assert fingerprint["l2_reset"] == "ok"
    assert set(result.baseline_overhead_ms) >= {"eager", "compile"}
    assert all(v > 0 for v in result.baseline_overhead_ms.values())
    assert "TF32 off" in result.timings["eager"].note
    if (fingerprint.get("nvml") or {}).get("available"):
        assert len(result.timings["candidate"].clocks_mhz) == 2
        assert len(result.timings["eager"].clocks_mhz) == 2


def test_launch_cover_times_the_device_not_the_launch(cuda):
    """A call that spends 100 us on the host before launching a tiny kernel: without the
    launch cover its samples hold the 100 us; with the default cover (150 us) they are the
    kernel's device time, as a profiler would sum it, while the host time still says the
    launch took longer than the work."""
    import torch

    x = torch.randn(1 << 16, device=cuda)

    def slow_launch(t):
        until = time.perf_counter() + 100e-6
        while time.perf_counter() < until:
            pass
        return t * 2

    def median(cover_us: float) -> float:
        timer = timing.Timer(cuda, flush_bytes=2 * _l2_bytes(cuda), launch_cover_us=cover_us)
        report = timer.measure(slow_launch, [[x]], warmup_ms=5, target_ms=20, min_reps=50, max_reps=200, budget_s=10)
        return report.timing.median_ms

    bare, covered = median(0.0), median(EvalConfig.launch_cover_us)
    print(f"\nlaunch cover: median without {bare * 1e3:.1f} us, with {EvalConfig.launch_cover_us:.0f} us cover "
          f"{covered * 1e3:.1f} us")
    assert bare > 0.1  # the host's 100 us is in every sample
    assert covered < 0.05  # a 64K-element multiply: a few microseconds of device time


def test_raise_clocks_brings_an_idle_device_up(cuda):
    timer = timing.Timer(cuda, flush_bytes=2 * _l2_bytes(cuda), launch_cover_us=EvalConfig.launch_cover_us)
    read = timer.clock_reader()
    if read is None:
        pytest.skip("no NVML")
    time.sleep(2.0)  # idle: the governor lowers the SM clock
    idle = read()
    timer.raise_clocks()
    timing._cuda_sleep(timer.cover_cycles)  # still busy while the clock is read
    busy = read()
    print(f"\nSM clock idle {idle} MHz, after raise_clocks {busy} MHz")
    assert busy is not None and idle is not None and busy >= idle
