"""The kernel trace's decoder (issue 55, harness/trace/records.py) on what a hostile process can
write into the trace's channel: a table of lines with what each must become (a record, or a
TraceDecodeError of a kind), and seeded fuzzing (random bytes, mutated honest traces) where the
only error that may leave the decoder is TraceDecodeError and every record it returns is inside
its bounds."""

from __future__ import annotations

import json
import random

import pytest

from kernelagent.harness.trace import records
from kernelagent.harness.trace.records import (CUT_SHORT, FORGED, OVERFLOW, Dropped, Flush, Hello, Kernel, Memcpy,
                                               Memset, TraceDecodeError, decode)
from tests.tracefake import one, process

KERNEL = {"seq": 0, "t": "kernel", "name": "relu_kernel", "corr": 3, "ctx": 1, "dev": 0, "stream": 7,
          "grid": [128, 1, 1], "block": [256, 1, 1], "start": 100, "end": 200, "graph": 0}


def line(**fields) -> bytes:
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n"


def kernel(**changes) -> bytes:
    return line(**{**KERNEL, **changes})


def raw_kernel(field: str, text: str) -> bytes:
    """A kernel line with one field's value written as raw JSON text."""
    data = dict(KERNEL, **{field: "@@"})
    return json.dumps(data, separators=(",", ":")).encode().replace(b'"@@"', text.encode()) + b"\n"


VALID = [
    ("hello", line(seq=0, t="hello", v=1, pid=9, cupti=26, ts=5), Hello),
    ("kernel", kernel(), Kernel),
    ("memcpy", line(seq=0, t="memcpy", kind=1, bytes=64, ctx=1, dev=0, stream=7, start=1, end=2, corr=4), Memcpy),
    ("memset", line(seq=0, t="memset", bytes=64, ctx=1, dev=0, stream=7, start=1, end=2, corr=4), Memset),
    ("dropped", line(seq=0, t="dropped", n=3), Dropped),
    ("flush", line(seq=0, t="flush", mark=2, final=1, ts=9), Flush),
    ("largest-int", kernel(start=2 ** 63 - 1), Kernel),
    ("name-of-512", kernel(name="k" * 512), Kernel),
    ("name-with-braces-and-brackets", kernel(name='void f<{lambda()#1}>(int [3], "q")'), Kernel),
]


@pytest.mark.parametrize("data,cls", [r[1:] for r in VALID], ids=[r[0] for r in VALID])
def test_valid_records_decode(data, cls):
    trace = decode(data)
    assert len(trace.records) == 1 and type(trace.records[0]) is cls


FORGED_ROWS = [
    ("nan", raw_kernel("start", "NaN")),
    ("infinity", raw_kernel("start", "-Infinity")),
    ("float", raw_kernel("start", "1.5")),
    ("exponent", raw_kernel("start", "1e3")),
    ("negative", kernel(start=-1)),
    ("two-to-the-63", kernel(start=2 ** 63)),
    ("ten-to-the-400", raw_kernel("start", "1" + "0" * 400)),
    ("bool-for-int", raw_kernel("start", "true")),
    ("null", raw_kernel("start", "null")),
    ("string-for-int", kernel(start="5")),
    ("grid-of-two", kernel(grid=[1, 1])),
    ("grid-nested", raw_kernel("grid", "[[1],1,1]")),
    ("grid-of-floats", raw_kernel("grid", "[1.0,1,1]")),
    ("object-in-field", raw_kernel("corr", '{"a":1}')),
    ("name-of-513", kernel(name="k" * 513)),
    ("name-not-string", kernel(name=5)),
    ("unknown-type", line(seq=0, t="kernel2", n=1)),
    ("missing-key", line(seq=0, t="dropped")),
    ("extra-key", line(seq=0, t="dropped", n=1, note="x")),
    ("duplicate-key", b'{"seq":0,"t":"dropped","n":1,"n":0}\n'),
    ("hello-version-2", line(seq=0, t="hello", v=2, pid=9, cupti=26, ts=5)),
    ("final-of-2", line(seq=0, t="flush", mark=2, final=2, ts=9)),
    ("too-long", kernel(name="k" * 500) [:-1] + b" " * 600 + b"\n"),
    ("not-ascii", kernel(name="k").replace(b"relu", b"r\xc3\xa9lu").replace(b'"k"', b'"k\xff"')),
    ("blank-line", b"\n"),
    ("array", b"[1,2,3]\n"),
    ("number", b"7\n"),
    ("two-objects", b'{"seq":0,"t":"dropped","n":1}{"seq":1,"t":"dropped","n":1}\n'),
    ("deep-arrays", b"[" * 1000 + b"\n"),
    ("deep-objects", b'{"a":' * 150 + b"1" + b"}" * 150 + b"\n"),
    ("brackets-in-a-string-of-an-extra-key", b'{"seq":0,"t":"dropped","n":1,"x":"[[[{{{"}\n'),
]


@pytest.mark.parametrize("data", [r[1] for r in FORGED_ROWS], ids=[r[0] for r in FORGED_ROWS])
def test_forged_lines_are_refused(data):
    with pytest.raises(TraceDecodeError) as raised:
        decode(data)
    assert raised.value.kind == FORGED and raised.value.line == 1
    assert raised.value.reason.isprintable() and len(raised.value.reason) < 300


@pytest.mark.parametrize("data", [b"[" * 1000 + b"\n", b'{"a":' * 150 + b"1" + b"}" * 150 + b"\n",
                                  raw_kernel("grid", "[[1],1,1]"), raw_kernel("corr", '{"a":[1]}')],
                         ids=["deep-arrays", "deep-objects", "nested-grid", "nested-object"])
def test_json_never_parses_a_nested_line(data, monkeypatch):
    """Nesting is refused before the parser runs, so the parser's recursion is never reached."""
    parsed = []
    real = records._DECODER

    class Spy:
        def decode(self, text):
            parsed.append(text)
            return real.decode(text)

    monkeypatch.setattr(records, "_DECODER", Spy())
    decode(kernel())
    assert len(parsed) == 1  # the spy sees what the parser gets
    with pytest.raises(TraceDecodeError):
        decode(data)
    assert len(parsed) == 1


def test_names_are_cleaned():
    trace = decode(kernel(name="relu\u001b]52;c;Zm9v\u0007_kernel\u202e\u0000"))
    assert trace.records[0].name == "relu_kernel"


def test_a_cut_short_last_line_is_cut_short():
    data = process(one("relu_kernel"), checks=1, warmups=1, segments=1, calls=2).to_bytes()
    with pytest.raises(TraceDecodeError) as raised:
        decode(data[:-5])
    assert raised.value.kind == CUT_SHORT
    assert len(decode(data).records) == data.count(b"\n")


@pytest.mark.parametrize("data,caps", [(b'{"seq":0,"t":"dropped","n":1}\n' * 11, {"max_records": 10}),
                                       (b"x" * 101, {"max_bytes": 100})], ids=["records", "bytes"])
def test_past_the_caps_is_overflow(data, caps):
    with pytest.raises(TraceDecodeError) as raised:
        decode(data, **caps)
    assert raised.value.kind == OVERFLOW


def test_empty_bytes_are_an_empty_trace():
    assert decode(b"").records == ()


def _in_bounds(trace: records.Trace) -> None:
    for r in trace.records:
        for value in vars(r).values():
            if isinstance(value, tuple):
                assert len(value) == 3 and all(0 <= v < 2 ** 63 for v in value)
            elif isinstance(value, bool):
                pass
            elif isinstance(value, int):
                assert 0 <= value < 2 ** 63
            else:
                assert isinstance(value, str) and len(value) <= records.MAX_NAME and value.isprintable()


def _decode_or_refuse(data: bytes) -> None:
    try:
        _in_bounds(decode(data))
    except TraceDecodeError as exc:
        assert exc.kind in (FORGED, CUT_SHORT, OVERFLOW) and exc.reason.isprintable()


def test_fuzz_random_bytes():
    rng = random.Random(55)
    alphabet = b'{}[]",:0123456789-eE.tnrufalsNIy\\u \n\x00\xff'
    for _ in range(1500):
        n = rng.randrange(0, 2000)
        if rng.random() < 0.5:
            data = bytes(rng.randrange(256) for _ in range(n))
        else:
            data = bytes(rng.choice(alphabet) for _ in range(n))
        _decode_or_refuse(data)


def test_fuzz_mutated_honest_traces():
    rng = random.Random(56)
    honest = process(one("relu_kernel"), checks=1, warmups=1, segments=1, calls=2).to_bytes()
    for _ in range(600):
        data = bytearray(honest)
        for _ in range(rng.randrange(1, 6)):
            at = rng.randrange(len(data))
            roll = rng.random()
            if roll < 0.4:
                data[at] = rng.randrange(256)
            elif roll < 0.7:
                data[at:at] = rng.choice([b"[", b"{", b"9" * 30, b"NaN", b"1e400", b'"', b"\\", b"\n", b"-"])
            else:
                del data[at:at + rng.randrange(1, 40)]
        _decode_or_refuse(bytes(data))
