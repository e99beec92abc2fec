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
    from kernelagent.harness.server.channels import Channels

    want = [torch.zeros(4, 8)]
    record = {"shape": [4, 8], "dtype": "float32", "nbytes": 128, "kind": "bytes"}
    assert _beyond([record], want) == ""
    assert "not read" in _beyond([dict(record, shape=[4, 4096], nbytes=65536)], want)
    assert "3 tensors described" in _beyond([record] * 3, want)
    with pytest.raises(transfer.TransferError):
        _beyond([dict(record, shape=[0, 1 << 62], nbytes=0)], want)
    with pytest.raises(transfer.TransferError):  # issue 54: 90,000 dimensions (a slow product in the reference)
        _beyond([dict(record, shape=[1 << 39] * 90_000, nbytes=0)], want)

    import time

    server_end, candidate_end = Pipe()
    job = types.SimpleNamespace(to_cand=server_end, clock=time.monotonic)
    channels = Channels(job)
    deadline = time.monotonic() + 5
    with pytest.raises(protocol.ProtocolError, match="too many"):
        channels.relay_payloads([record] * 513, deadline)
    candidate_end.send_bytes(b"x" * 4096)
    with pytest.raises(protocol.ProtocolError, match="longer than"):
        channels.relay_payloads([record], deadline)  # longer than its record says
    job.to_cand, candidate_end = Pipe()  # a frame over its limit closes the connection
    candidate_end.send_bytes(b"y" * 128)
    assert channels.relay_payloads([record], deadline) == [b"y" * 128]
    # More bytes than the problem's own tensors allow: refused before one is read (the server
    # would hold them all), and a header alone never makes the reader allocate what it claims.
    job.to_cand, candidate_end = Pipe()
    with pytest.raises(protocol.ProtocolError, match="more than the problem's own"):
        channels.relay_payloads([dict(record, nbytes=1 << 30)] * 4, deadline, limit=1 << 31)
    import os
    import tracemalloc

    from kernelagent.harness.server.stages import CandidateGone, StageTimeout

    os.write(candidate_end.fileno(), (1 << 30).to_bytes(4, "big") + b"w" * 10)
    tracemalloc.start()
    with pytest.raises(StageTimeout):
        channels.relay_payloads([dict(record, nbytes=1 << 30)], time.monotonic() + 0.3, limit=1 << 31)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 16 << 20, peak  # 1 MiB to start with, not the 1 GiB the header claims
    # A payload begun and never finished: the stage's timeout, never a wait past it.
    job.to_cand, candidate_end = Pipe()
    candidate_end.send_bytes(b"z" * 128)
    os.write(candidate_end.fileno(), (128).to_bytes(4, "big") + b"z" * 3)
    with pytest.raises(StageTimeout):
        channels.relay_payloads([record, record], time.monotonic() + 0.3)
    candidate_end.close()
    job.to_cand, candidate_end = Pipe()
    os.write(candidate_end.fileno(), (128).to_bytes(4, "big") + b"z" * 3)
    candidate_end.close()
    with pytest.raises(CandidateGone):  # it died mid-frame: its crash, not our OSError
        channels.relay_payloads([record], time.monotonic() + 5)


# --------------------------------------------------------------------------------------
# read_frame: every read of the candidate's channel is bounded in time as well as size
# --------------------------------------------------------------------------------------

def _pipe():
    reader, writer = mp.Pipe(duplex=False)
    return reader, writer


def _clock(seconds: float):
    import time

    end = time.monotonic() + seconds
    return lambda: end - time.monotonic()


def test_read_frame_reads_what_send_bytes_wrote():
    reader, writer = _pipe()
    writer.send_bytes(protocol.encode("compiled", "j"))
    assert protocol.recv(reader, {"compiled"}, "j", remaining=_clock(5))["type"] == "compiled"
    big = bytes(range(256)) * 4096  # over one pipe buffer: read in pieces while the writer blocks
    import threading

    thread = threading.Thread(target=writer.send_bytes, args=(big,))
    thread.start()
    assert bytes(protocol.recv_payload(reader, max_bytes=len(big), remaining=_clock(5))) == big
    thread.join()


def test_a_frame_begun_and_never_finished_times_out_at_the_deadline():
    import os
    import struct
    import time

    reader, writer = _pipe()
    os.write(writer.fileno(), struct.pack("!i", 1000) + b'{"v":')  # then silence, the writer alive
    started = time.monotonic()
    with pytest.raises(protocol.FrameTimeout, match="5 bytes into a 1000-byte read"):
        protocol.recv(reader, {"outputs"}, remaining=_clock(0.3))
    assert time.monotonic() - started < 2.0  # Connection.recv_bytes would still be waiting


def test_a_channel_closed_mid_frame_is_the_sender_gone_not_an_oserror():
    import os
    import struct

    reader, writer = _pipe()
    os.write(writer.fileno(), struct.pack("!i", 1000) + b'{"v":')
    writer.close()
    with pytest.raises(protocol.TruncatedFrame):
        protocol.recv(reader, {"outputs"}, remaining=_clock(5))
    reader, writer = _pipe()
    writer.close()
    with pytest.raises(EOFError):  # nothing at all: the plain end of the channel
        protocol.recv(reader, {"outputs"}, remaining=_clock(5))


@pytest.mark.parametrize("header", [b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff" + (1 << 40).to_bytes(8, "big"),
                                    b"\xff\xff\xff\xfe"])
def test_an_oversized_or_negative_length_is_refused_before_anything_is_allocated(header):
    import os

    reader, writer = _pipe()
    os.write(writer.fileno(), header)
    with pytest.raises(ProtocolError, match="frame longer|bad frame length"):
        protocol.recv_payload(reader, max_bytes=1 << 20, remaining=_clock(5))


def test_a_channel_reset_with_our_message_unread_is_the_sender_gone():
    """A socketpair whose other end was closed with our message still unread resets: the
    reader hears EOFError (the candidate gone), where recv_bytes raised ConnectionResetError."""
    ours, theirs = mp.Pipe()
    ours.send_bytes(protocol.encode("check_reply", "j", passed=True, stop=False))  # never read
    theirs.close()
    with pytest.raises(EOFError):
        protocol.recv(ours, {"outputs"}, remaining=_clock(5))


def _kernels(body: bytes) -> bytes:
    return b'{"v":2,"type":"kernels","job":"j","kernels":' + body + b'}'


# issue 54, class 5: the candidate's process sent these; each was a RecursionError or an
# OverflowError in the server (a harness error), or a number the first float() on it broke.
@pytest.mark.parametrize("raw,fragment", [
    (_kernels(b"[" * 200_000 + b"]" * 200_000), "nested 200001 levels deep"),
    (_kernels(b'[{"name":"k","calls":' + str(10**400).encode() + b'}]'), "integer of 401 digits"),
    (_kernels(b'[{"name":"k","calls":' + str(2**63).encode() + b'}]'), "integer out of range"),
    (_kernels(b'[{"name":"k","total_ms":1e400}]'), "number out of range"),
    (_kernels(b'[{"name":"k","total_ms":-1e400}]'), "number out of range"),
    (_kernels(b'["' + b"x" * (65 << 10) + b'"]'), "string of 66,560 characters"),
    (_kernels(b'[{"' + b"x" * (65 << 10) + b'":1}]'), "string of 66,560 characters"),
    (_kernels(b"[" + b"0," * 100_000 + b"0]"), "array of 100,001 elements"),
    (_kernels(b"[" + b"{}," * 40 + b"[" * 33 + b"]" * 33 + b"]"), "nested 35 levels deep"),
], ids=["deep-200k", "int-10**400", "int-2**63", "float-1e400", "float--1e400", "long-string", "long-key",
        "long-array", "deep-35"])
def test_unbounded_json_from_the_candidate_is_a_protocol_error(raw, fragment):
    with pytest.raises(ProtocolError, match=fragment):
        protocol.decode(raw, {"kernels"}, bounds=protocol.CANDIDATE_BOUNDS)


def test_brackets_inside_strings_do_not_count_as_nesting():
    name = '[{"\\"[[[[' * 2000
    raw = protocol.encode("kernels", "j", kernels=[{"name": name[:60000], "calls": 2**62}])
    message = protocol.decode(raw, {"kernels"}, bounds=protocol.CANDIDATE_BOUNDS)
    assert message["kernels"][0] == {"name": name[:60000], "calls": 2**62}


def test_the_deep_json_scan_is_linear():
    """A lone quote before a run of escaped quotes: a string regex retried at each quote would
    take minutes on a 1 MiB frame."""
    import time

    started = time.monotonic()
    with pytest.raises(ProtocolError):
        protocol.decode(b'["' + b'\\"[' * 300_000, {"kernels"}, bounds=protocol.CANDIDATE_BOUNDS)
    assert time.monotonic() - started < 2.0


def test_the_candidate_sides_evidence_stays_within_its_bounds():
    """What our code in the candidate's process sends (flags, profiler rows) is cut to fit the
    bounds the server reads it with: an honest flag with a long message (an exception's text) is
    never a protocol breach."""
    flags = [{"kind": "defences", "severity": "info", "message": "evidence failed: " + "x" * (200 << 10),
              "count": 10**30}]
    raw = protocol.encode("done", "j", flags=protocol.json_safe(flags, max_str=protocol.CANDIDATE_STRING_CLIP),
                          memory={})
    message = protocol.decode(raw, {"done"}, bounds=protocol.CANDIDATE_BOUNDS)
    assert len(message["flags"][0]["message"]) == protocol.CANDIDATE_STRING_CLIP
    assert message["flags"][0]["count"] is None
