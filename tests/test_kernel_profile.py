"""The profiler's clock (child/kernel_profile.py): each profiled call's kernels told apart by its
marker range, the median call's rows, and the summed fallback. The device records here are the
shapes torch.profiler gives on a GPU (name, start, end in one time base); the CPU test runs the
real profiler."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kernelagent.harness.child import kernel_profile as kp

# Five calls, each in its range [100*i, 100*i + 60], with an L2 flush between them (at 100*i + 80).
WINDOWS = [(100.0 * i, 100.0 * i + 60) for i in range(5)]


def _call(i: int, kernels: list[tuple[str, float]]) -> list[tuple[str, float, float]]:
    out, t = [], 100.0 * i + 5
    for name, us in kernels:
        out.append((name, t, t + us))
        t += us + 1
    return out


def _flush(i: int) -> tuple[str, float, float]:
    return ("fill_kernel", 100.0 * i + 70, 100.0 * i + 90)


@pytest.mark.parametrize("case, calls, expected_ms, mean_differs", [
    # (why, each call's kernels in microseconds, the median call's total in ms, whether the mean
    # of the calls would read otherwise: the rows that tell the median from the mean)
    ("all alike", [[("k", 40.0)]] * 5, 0.040, False),
    ("one slow call", [[("k", 40.0)]] * 4 + [[("k", 55.0)]], 0.040, True),
    ("one call lost a record", [[("a", 20.0), ("b", 20.0)]] * 4 + [[("a", 20.0)]], 0.040, True),
    ("two kernels, calls vary", [[("a", 10.0), ("b", 30.0 + d)] for d in (0, 2, 4, 6, 8)], 0.044, False),
])
def test_the_median_call_is_immune_to_one_slow_or_incomplete_call(case, calls, expected_ms, mean_differs):
    records = [r for i, call in enumerate(calls) for r in _call(i, call)] + [_flush(i) for i in range(5)]
    split = kp.split_calls(records, WINDOWS)
    assert split is not None, case
    assert [len(c) for c in split] == [len(c) for c in calls], "a flush between calls was counted as a kernel"
    rows = kp.median_call_rows(split)
    assert sum(r["total_ms"] for r in rows) == pytest.approx(expected_ms), case
    mean_ms = sum(us for call in calls for _, us in call) / len(calls) / 1e3
    assert (mean_ms != pytest.approx(expected_ms)) == mean_differs, case


def test_a_median_calls_rows_count_each_kernels_launches():
    calls = [[("a", 5.0), ("b", 10.0), ("a", 5.0)]] * 3
    records = [r for i, call in enumerate(calls) for r in _call(i, call)]
    rows = {r["name"]: r for r in kp.median_call_rows(kp.split_calls(records, WINDOWS[:3]))}
    assert rows["a"]["calls"] == 2 and rows["a"]["total_ms"] == pytest.approx(0.010)
    assert rows["b"]["calls"] == 1 and rows["b"]["total_ms"] == pytest.approx(0.010)


@pytest.mark.parametrize("windows, records", [
    ([], [("k", 5.0, 10.0)]),                                  # no marker ranges at all
    (WINDOWS[:2], _call(0, [("k", 4.0)])),                     # the second range holds no kernel
    (WINDOWS[:1], [("k", 200.0, 210.0)]),                      # the clocks do not line up
])
def test_calls_that_cannot_be_told_apart_give_none(windows, records):
    assert kp.split_calls(records, windows) is None


def _averages(*rows: tuple[str, float, int]) -> list[SimpleNamespace]:
    return [SimpleNamespace(key=k, self_device_time_total=us, self_cpu_time_total=0.0, count=n,
                            device_type="DeviceType.CUDA") for k, us, n in rows]


def test_the_summed_fallback_takes_the_flush_and_the_marker_out():
    averages = _averages(("kern", 500.0, 5), ("fill_kernel", 300.0, 10), (kp.CALL_MARK, 900.0, 5))
    rows = kp.summed_rows(averages, {"fill_kernel": (150.0, 5)}, True, 5)
    got = {r["name"]: r for r in rows}
    assert set(got) == {"kern", "fill_kernel"}, "the marker range is not a kernel"
    assert got["kern"]["total_ms"] == pytest.approx(0.1) and got["kern"]["calls"] == 1
    assert got["fill_kernel"]["total_ms"] == pytest.approx(0.03) and got["fill_kernel"]["calls"] == 1


def test_the_marker_ranges_copy_on_the_device_timeline_is_neither_a_window_nor_a_kernel():
    span = SimpleNamespace
    events = [SimpleNamespace(name=kp.CALL_MARK, device_type="DeviceType.CPU", time_range=span(start=0, end=60),
                              self_device_time_total=0.0),
              SimpleNamespace(name=kp.CALL_MARK, device_type="DeviceType.CUDA", time_range=span(start=4, end=50),
                              self_device_time_total=46.0),
              SimpleNamespace(name="k", device_type="DeviceType.CUDA", time_range=span(start=5, end=45),
                              self_device_time_total=40.0)]
    kernels, windows = kp._records(events)
    assert windows == [(0.0, 60.0)] and kernels == [("k", 5.0, 45.0)]


class _Square(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * x)


def test_on_the_cpu_the_rows_are_the_calls_operators_without_the_marker():
    problem = SimpleNamespace(get_inputs=lambda: [torch.randn(64, 64)], get_init_inputs=lambda: [])
    rows = kp.profile_kernels(_Square(), problem, seed=0, smoke=False, device=torch.device("cpu"))
    names = {r["name"] for r in rows}
    assert "aten::mul" in names and "aten::relu" in names
    assert kp.CALL_MARK not in names
    assert all(r["kind"] == "cpu-op" and 0 < r["share"] <= 1 for r in rows)
    assert sum(r["share"] for r in rows) <= 1.0 + 1e-9


def test_the_clocks_are_raised_right_before_the_profiled_calls():
    """An idle GPU's clocks drop: the ramp (the timer's raise_clocks) runs after the unprofiled
    call and before the first profiled one (on the CPU: once, with no flush to profile alone)."""
    order: list[str] = []

    class Recorded(torch.nn.Module):
        def forward(self, x):
            order.append("call")
            return x + 1

    problem = SimpleNamespace(get_inputs=lambda: [torch.randn(8)], get_init_inputs=lambda: [])
    kp.profile_kernels(Recorded(), problem, seed=0, smoke=False, device=torch.device("cpu"),
                       raise_clocks=lambda: order.append("ramp"))
    assert order == ["call", "ramp"] + ["call"] * kp.PROFILED_CALLS


def _event(name: str, device: str, start: float, end: float) -> SimpleNamespace:
    on_device = device == "CUDA"
    return SimpleNamespace(name=name, device_type=f"DeviceType.{device}",
                           time_range=SimpleNamespace(start=start, end=end),
                           self_device_time_total=(end - start) if on_device else 0.0)


def test_a_device_whose_calls_cannot_be_told_apart_falls_back_to_the_sum_and_says_so():
    averages = _averages(("kern", 500.0, 5))
    whole = [_event(kp.CALL_MARK, "CPU", 100.0 * i, 100.0 * i + 60) for i in range(5)] + \
        [_event("kern", "CUDA", 100.0 * i + 10, 100.0 * i + 10 + (40 if i else 80)) for i in range(5)]
    notes: list[str] = []
    rows = kp.call_rows(whole, averages, {}, True, notes)
    assert notes == [] and rows == [{"name": "kern", "total_ms": pytest.approx(0.040), "calls": 1}]
    # the same kernels, but no marker range holds them (the profiler's clocks did not line up)
    shifted = [e for e in whole if e.name == kp.CALL_MARK] + \
        [_event("kern", "CUDA", 1000.0 + 100.0 * i, 1040.0 + 100.0 * i) for i in range(5)]
    rows = kp.call_rows(shifted, averages, {}, True, notes)
    assert rows == [{"name": "kern", "total_ms": pytest.approx(0.1), "calls": 1}]
    assert len(notes) == 1 and "could not be told apart" in notes[0] and "summed" in notes[0]
    notes.clear()
    kp.call_rows([], averages, {}, False, notes)
    assert notes == [], "the CPU's rows are summed by design: nothing to say"
