"""The timed loop's order (harness/loop_order.py): one typed message to the candidate's process
(`time`) and the reference's (`calibrate`). A field missing or of the wrong kind is a broken
protocol, never a guess."""

from __future__ import annotations

import pytest

from kernelagent.harness.loop_order import LoopOrder
from kernelagent.harness.protocol import ProtocolError

GOOD = {"calls": 40, "warmup_calls": 5, "keep": 2, "segments": 2, "budget_bytes": 1 << 20, "l2_bytes": 50 << 20,
        "payloads": False}


def test_an_order_round_trips_through_its_message():
    order = LoopOrder(**GOOD)
    message = {"type": "time", "seed": 7, **order.fields()}
    assert LoopOrder.from_message(message) == order and order.fields() == GOOD
    assert LoopOrder.from_message({**GOOD, "l2_bytes": None}).l2_bytes is None


@pytest.mark.parametrize("change, error", [
    ({"calls": "40"}, "calls must be an int"),
    ({"calls": -1}, "calls must be an int >= 0"),
    ({"warmup_calls": 2.5}, "warmup_calls must be an int"),
    ({"keep": True}, "keep must be an int"),
    ({"segments": 0}, "segments must be an int >= 1"),
    ({"budget_bytes": None}, "budget_bytes must be an int"),
    ({"l2_bytes": -5}, "l2_bytes must be an int >= 0 or None"),
    ({"l2_bytes": "big"}, "l2_bytes must be an int >= 0 or None"),
    ({"payloads": 1}, "payloads must be true or false"),
], ids=lambda v: str(v)[:24])
def test_a_malformed_order_is_a_protocol_error(change, error):
    with pytest.raises(ProtocolError, match=error):
        LoopOrder.from_message({**GOOD, **change})


@pytest.mark.parametrize("missing", sorted(GOOD))
def test_a_missing_field_is_named(missing):
    message = {k: v for k, v in GOOD.items() if k != missing}
    with pytest.raises(ProtocolError, match=f"{missing} is missing"):
        LoopOrder.from_message(message)
