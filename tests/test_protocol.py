"""protocol.py: typed, versioned, bounded messages; garbage is a ProtocolError, never a crash."""

from __future__ import annotations

import json
import multiprocessing as mp
import pickle

import pytest

from kernelagent.harness import protocol
from kernelagent.harness.protocol import ProtocolError


def test_round_trip_with_job_and_nonce():
    raw = protocol.encode("result", "job1", "secret", result={"status": "correct"})
    message = protocol.decode(raw, {"result"}, job="job1", nonce="secret")
    assert message["result"] == {"status": "correct"}


@pytest.mark.parametrize("raw,accept,job,nonce,fragment", [
    (pickle.dumps({"type": "result"}), {"result"}, None, None, "not a JSON message"),
    (b"[1, 2]", {"result"}, None, None, "JSON object"),
    (json.dumps({"v": 1, "type": "result", "job": "j", "result": {}}).encode(), {"result"}, None, None, "version"),
    (protocol.encode("done", "j", flags=[], memory={}), {"outputs"}, None, None, "unexpected message type"),
    (protocol.encode("result", "other", "n", result={}), {"result"}, "job1", "n", "another job"),
    (protocol.encode("result", "job1", "forged", result={}), {"result"}, "job1", "n", "nonce"),
    (protocol.encode("result", "job1", None, result={}), {"result"}, "job1", "n", "nonce"),
    (json.dumps({"v": 2, "type": "result", "job": "j"}).encode(), {"result"}, None, None, "missing field"),
    (json.dumps({"v": 2, "type": "result", "job": "j", "result": [], }).encode(), {"result"}, None, None,
     "wrong type"),
    (json.dumps({"v": 2, "type": "check_reply", "job": "j", "passed": 1, "stop": False}).encode(),
     {"check_reply"}, None, None, "wrong type"),
    (json.dumps({"v": 2, "type": "compiled", "job": "j", "evil": 1}).encode(), {"compiled"}, None, None,
     "unexpected fields"),
    (b'{"v": 2, "type": "calibrated", "job": "j", "seconds": NaN, "calls": 1}', {"calibrated"}, None, None,
     "not a JSON message"),
])
def test_malformed_messages_are_refused(raw, accept, job, nonce, fragment):
    with pytest.raises(ProtocolError, match=fragment):
        protocol.decode(raw, accept, job, nonce)


def test_a_frame_over_the_bound_is_refused_before_it_is_read():
    a, b = mp.Pipe()
    a.send_bytes(b"x" * 5000)
    with pytest.raises(ProtocolError, match="longer than"):
        protocol.recv(b, {"compiled"}, max_bytes=1000)


def test_non_finite_floats_never_leave_a_process():
    with pytest.raises(ValueError):
        protocol.encode("calibrated", "j", seconds=float("inf"), calls=1)
    assert protocol.json_safe({"a": float("nan"), "b": (1, 2.5), "c": object}) == \
        {"a": None, "b": [1, 2.5], "c": str(object)}


def test_tensors_the_candidate_describes_are_bounded_by_the_problems_own():
    """Issue 24, class 3: the reference reads no more tensors, and none larger, than its own
    outputs; a pathological shape is the candidate's malformed result, never a harness error;
    the server relays at most 512 tensors, each frame no longer than its record says."""
    import types
    from multiprocessing import Pipe

    import torch

    from kernelagent.harness import protocol
    from kernelagent.harness.child import transfer
    from kernelagent.harness.child.reference_side import _beyond
    from kernelagent.harness.server.job import Job

    want = [torch.zeros(4, 8)]
    record = {"shape": [4, 8], "dtype": "float32", "nbytes": 128, "kind": "bytes"}
    assert _beyond([record], want) == ""
    assert "not read" in _beyond([dict(record, shape=[4, 4096], nbytes=65536)], want)
    assert "3 tensors described" in _beyond([record] * 3, want)
    with pytest.raises(transfer.TransferError):
        _beyond([dict(record, shape=[0, 1 << 62], nbytes=0)], want)

    server_end, candidate_end = Pipe()
    job = types.SimpleNamespace(to_cand=server_end)
    with pytest.raises(protocol.ProtocolError, match="too many"):
        Job.relay_payloads(job, [record] * 513)
    candidate_end.send_bytes(b"x" * 4096)
    with pytest.raises(protocol.ProtocolError, match="longer than"):
        Job.relay_payloads(job, [record])  # longer than its record says
    job.to_cand, candidate_end = Pipe()  # a frame over its limit closes the connection
    candidate_end.send_bytes(b"y" * 128)
    assert Job.relay_payloads(job, [record]) == [b"y" * 128]
