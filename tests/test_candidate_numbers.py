"""Every number a candidate sends is checked (issue 41, class 3), as units; the hostile table
(tests/test_hostile.py, r4_* rows) runs the same attacks end to end."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from kernelagent.harness import protocol
from kernelagent.harness.server import verdict
from kernelagent.harness.server.channels import Channels
from kernelagent.harness.server.timed import check_samples


@pytest.mark.parametrize("sample", [-1.0, 0.0, float("nan"), float("inf"), 1e308, True, "1.0", None])
def test_a_sample_that_is_no_time_is_a_protocol_breach(sample):
    with pytest.raises(protocol.ProtocolError):
        check_samples([0.2, sample, 0.2], segment_s=0.01)


def test_honest_samples_within_the_segment_pass():
    check_samples([0.2] * 40, segment_s=0.01)  # 40 calls of 0.2 ms in a 10 ms segment
    check_samples([10.4], segment_s=0.01)  # one call as long as the segment, within the clocks' slack
    with pytest.raises(protocol.ProtocolError):
        check_samples([25.0], segment_s=0.01)  # a call longer than the segment that holds it


def test_the_sample_window_opens_before_the_order_leaves():
    """An honest call is checked against a window that opens before "go" is sent: the candidate
    woken by it may take the server's core (2 cores, busy), and the server reads its clock again
    only milliseconds after the call began. Checked from after the send, honest kernels of 40 ms
    were rejected in CPU CI (a 44.3 ms call in a segment seen as 40.8 ms)."""
    import time

    from kernelagent.harness.server.timed import TimedLoop

    seen = {}

    def send(kind, **fields):  # the candidate runs its 25 ms call while the server waits for a core
        seen["order"] = (kind, fields)
        seen["entered"] = time.perf_counter()
        time.sleep(0.03)

    report = {"type": "timing", "samples_ms": [25.0], "calls": 1}
    channels = SimpleNamespace(cand_send=send, cand_recv=lambda kinds, deadline: report if kinds == {"timing"} else None)
    message, sent, t0 = TimedLoop(SimpleNamespace(channels=channels)).run_segment(7, time.monotonic() + 5)
    assert message is report and seen["order"] == ("go", {"seed": 7})
    assert sent <= seen["entered"] and t0 >= seen["entered"] + 0.03
    now = time.perf_counter()
    check_samples(message["samples_ms"], now - sent)  # the window the server checks with
    with pytest.raises(protocol.ProtocolError):
        check_samples(message["samples_ms"], now - t0)  # what it used to check with


def test_a_derived_sets_outputs_are_bounded_by_its_own_sizes():
    job = SimpleNamespace(ready={"input_bytes": 1 << 20, "output_bytes": 1 << 20,
                                 "extra_bytes": {"extra:0": 3 << 20}},
                          derived_dims={"extra:0": ("n=3", "n=1"), "extra:1": ("n=5", "n=1")})
    channels = Channels(job)
    main = channels.payload_limit()
    assert main == 4 * (2 << 20) + (16 << 20)
    assert channels.payload_limit(True, "extra:0") == 4 * (3 << 20) + (16 << 20)  # its own sizes
    assert channels.payload_limit(True, "extra:1") == main  # derived, not sized: the main set's bound
    # the problem's own get_extra_inputs() set (not run ahead): up to a payload frame
    assert channels.payload_limit(True, "extra:7") == protocol.MAX_PAYLOAD_FRAME
    assert channels.payload_limit(True, "extra:0") < 896 << 20


def test_a_median_far_below_the_verified_mean_is_not_believed_with_few_segments():
    """The CPU's short loops run in fewer segments than the server's distribution needs: the
    claimed median is still checked against the verified mean (0.64x passed unflagged)."""
    claimed = [0.5] * 6 + [2.6] * 2  # mean 1.025 ms, median 0.5 ms: 0.49x
    mean = sum(claimed) / len(claimed)
    calls = len(claimed)
    decision = verdict.trusted_time(claimed, calls, loop_s=mean * calls / 1e3 + 0.01, calibration_s=0.01,
                                    meaningful=False, segment_s=[mean * calls / 1e3 + 0.01], calls_per_segment=calls)
    assert decision.source == "server", decision
    assert any(f["kind"] in ("clock-median", "clock-mismatch") for f in decision.flags)
    assert math.isclose(decision.timing["median_ms"], mean, rel_tol=0.05)
    honest = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.03, 0.97]
    total = sum(honest) / 1e3 + 0.01
    ok = verdict.trusted_time(honest, 8, loop_s=total, calibration_s=0.01, meaningful=False,
                              segment_s=[total], calls_per_segment=8)
    assert ok.source == "in-process" and not ok.flags

