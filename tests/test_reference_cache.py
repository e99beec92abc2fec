"""The trusted reference keeps its cached device memory between the timed loop's segments.

On an H100 (2026-11-27) memory given back to the driver (`torch.cuda.empty_cache`) was cleared in
the background, and a 4.29 ms streaming kernel read 4.98 ms for about 25 ms after: the reference
gave its 13 GB back after every segment's check, so the candidate's next calls ran slow in runs
that began at segment boundaries. The server asks it to keep the cache until the loop's last
segment (`keep_cache`), and every other check still gives memory back."""

from __future__ import annotations

from kernelagent.harness import protocol
from kernelagent.harness.child import reference_side


def _serve(monkeypatch, messages):
    ref = object.__new__(reference_side.ReferenceSide)
    ref.server, ref.job_id, ref.nonce = None, "job", "nonce"
    events = []
    ref.check = lambda message, payloads: events.append(("check", message["name"]))
    ref.release = lambda: events.append(("release",))
    script = iter(messages)

    def recv(conn, accept, job, nonce=None):
        try:
            return next(script)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr(reference_side.protocol, "recv", recv)
    ref.serve()
    return events


def _check(name, keep):
    return {"type": "check", "name": name, "kind": "main", "seed": 1, "n_outputs": 1, "outputs": [], "inputs": [],
            "stop_on_failure": True, "candidate_error": None, "keep_cache": keep}


def test_the_reference_gives_memory_back_only_when_the_server_says_so(monkeypatch):
    events = _serve(monkeypatch, [_check("check 0", False), _check("timed call 3", True),
                                  _check("timed call 9", True), _check("timed call 15", False)])
    assert events == [("check", "check 0"), ("release",), ("check", "timed call 3"), ("check", "timed call 9"),
                      ("check", "timed call 15"), ("release",)]


def test_keep_cache_is_a_required_boolean_of_every_check():
    fields = dict(name="x", kind="main", seed=1, n_outputs=1, outputs=[], inputs=[], stop_on_failure=True,
                  candidate_error=None)
    raw = protocol.encode("check", "job", "n", **fields, keep_cache=True)
    assert protocol.decode(raw, {"check"}, "job", "n")["keep_cache"] is True
    for bad in ({}, {"keep_cache": 1}, {"keep_cache": "yes"}):
        raw = protocol.encode("check", "job", "n", **fields, **bad)
        try:
            protocol.decode(raw, {"check"}, "job", "n")
        except protocol.ProtocolError:
            continue
        raise AssertionError(f"decoded a check with {bad}")

