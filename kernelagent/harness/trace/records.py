"""The validating decoder of the kernel trace (issue 55): the bytes the server read from the
trace's pipe -> typed records, or `TraceDecodeError`.

The pipe's write end lives in the candidate's process, which is hostile: anything can arrive
there, interleaved with the tracer's own lines or instead of them. So nothing is believed
beyond its form, and every form is bounded before it is parsed (TRACE_SPEC.md, "Records"):

- the whole buffer: at most MAX_BYTES bytes and MAX_RECORDS lines (past either: `overflow`,
  the trace is incomplete and the evidence falls back to Nsight Compute);
- a line: ASCII, at most MAX_LINE bytes, one JSON object; a last line without its newline
  means the writer stopped mid-record (`cut-short`: the trace is missing its end);
- an object: flat. Before `json.loads` runs, the line's strings are taken out and what is left
  may hold one object and only flat arrays, so the parser never nests deeper than two levels
  (grid and block); floats, NaN and Infinity, duplicate keys, unknown or missing keys, booleans
  where integers belong and integers outside [0, 2**63) are refused;
- a kernel's name: at most MAX_NAME characters, cleaned with text.clean_text (no controls, no
  escape sequences) before anything prints it.

Each record becomes a frozen dataclass; a `Trace` keeps them in the order they arrived.
Whether the records make sense together (seq without gaps, markers in order, end >= start) is
for the rules (rules.py), which say `trace-forged` or `trace-missing`; this module only says
what does not even parse, and its error is never anything but `TraceDecodeError`.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Union

from kernelagent.text import clean_text

MAX_LINE = 1024  # bytes of one record, newline excluded
MAX_RECORDS = 200_000
MAX_BYTES = 64 * 1024 * 1024
MAX_NAME = 512  # characters of a kernel's name (the tracer truncates to 512 bytes)
INT_LIMIT = 2 ** 63  # every integer field lies in [0, INT_LIMIT)
VERSION = 1
MARKER_NAME = "kernelagent_trace_marker"  # the tracer's own marker kernel (TRACE_SPEC.md "Markers")

# Why a decode failed, which the rules turn into a flag (rules.decode_failure):
FORGED = "forged"  # a line that is not a record of the contract: trace-forged
CUT_SHORT = "cut-short"  # the last line stops mid-record: trace-missing
OVERFLOW = "overflow"  # past the caps: trace-incomplete (fall back to Nsight Compute)


class TraceDecodeError(Exception):
    """The trace's bytes are not a trace of the contract. `reason`: one short line (it may quote
    a bounded, cleaned piece of the input); `kind`: FORGED, CUT_SHORT or OVERFLOW; `line`: the
    1-based line it failed on (0: the buffer as a whole)."""

    def __init__(self, reason: str, *, kind: str = FORGED, line: int = 0):
        super().__init__(reason)
        self.reason, self.kind, self.line = reason, kind, line


@dataclass(frozen=True)
class Hello:
    seq: int
    v: int
    pid: int
    cupti: int
    ts: int


@dataclass(frozen=True)
class Kernel:
    seq: int
    name: str
    corr: int
    ctx: int
    dev: int
    stream: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    start: int
    end: int
    graph: int

    @property
    def is_marker(self) -> bool:
        return self.name == MARKER_NAME


@dataclass(frozen=True)
class Memcpy:
    seq: int
    kind: int
    bytes: int
    ctx: int
    dev: int
    stream: int
    start: int
    end: int
    corr: int


@dataclass(frozen=True)
class Memset:
    seq: int
    bytes: int
    ctx: int
    dev: int
    stream: int
    start: int
    end: int
    corr: int


@dataclass(frozen=True)
class Dropped:
    seq: int
    n: int


@dataclass(frozen=True)
class Flush:
    seq: int
    mark: int
    final: bool
    ts: int


Record = Union[Hello, Kernel, Memcpy, Memset, Dropped, Flush]


@dataclass(frozen=True)
class Trace:
    """The records in the order they arrived (never re-sorted: the order is evidence too)."""

    records: tuple[Record, ...] = ()

    def of(self, cls: type) -> list[Any]:
        return [r for r in self.records if isinstance(r, cls)]

    @property
    def kernels(self) -> list[Kernel]:
        return self.of(Kernel)

    @property
    def markers(self) -> list[Kernel]:
        return [k for k in self.kernels if k.is_marker]


# Field name -> what it holds: "int" (in [0, INT_LIMIT)), "name" (a bounded string), "dim3"
# (exactly three ints), "flag" (0 or 1). Every key is required and no other key is allowed.
_SCHEMA: dict[str, tuple[type, dict[str, str]]] = {
    "hello": (Hello, {"v": "int", "pid": "int", "cupti": "int", "ts": "int"}),
    "kernel": (Kernel, {"name": "name", "corr": "int", "ctx": "int", "dev": "int", "stream": "int",
                        "grid": "dim3", "block": "dim3", "start": "int", "end": "int", "graph": "int"}),
    "memcpy": (Memcpy, {"kind": "int", "bytes": "int", "ctx": "int", "dev": "int", "stream": "int",
                        "start": "int", "end": "int", "corr": "int"}),
    "memset": (Memset, {"bytes": "int", "ctx": "int", "dev": "int", "stream": "int", "start": "int",
                        "end": "int", "corr": "int"}),
    "dropped": (Dropped, {"n": "int"}),
    "flush": (Flush, {"mark": "int", "final": "flag", "ts": "int"}),
}

# A JSON string (escapes included), taken out before the nesting is counted.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
# One object whose values hold no object and no array but flat arrays (strings taken out first).
_FLAT_OBJECT = re.compile(rb"\s*\{[^\[\]{}]*(?:\[[^\[\]{}]*\][^\[\]{}]*)*\}\s*")


def _refuse(what: str) -> Any:
    raise ValueError(what)


_KEYS = {kind: {"seq", "t", *fields} for kind, (_, fields) in _SCHEMA.items()}


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key[:20]!r}")
        out[key] = value
    return out


# One decoder for every line: floats, NaN and Infinity refused, duplicate keys refused.
_DECODER = json.JSONDecoder(parse_float=lambda s: _refuse("a float"), parse_constant=lambda s: _refuse("NaN or Infinity"),
                            object_pairs_hook=_no_duplicates)


def _shown(line: bytes, width: int = 60) -> str:
    return clean_text(line[:width].decode("ascii", "replace"))


def _int(value: Any, key: str) -> int:
    if type(value) is not int or not 0 <= value < INT_LIMIT:  # bool is not an int here
        raise ValueError(f"{key} is not an integer in [0, 2**63)")
    return value


def _field(value: Any, key: str, form: str) -> Any:
    if form == "int":
        return _int(value, key)
    if form == "flag":
        if type(value) is not int or value not in (0, 1):
            raise ValueError(f"{key} is not 0 or 1")
        return bool(value)
    if form == "dim3":
        if type(value) is not list or len(value) != 3:
            raise ValueError(f"{key} is not three integers")
        x, y, z = value
        return (_int(x, key), _int(y, key), _int(z, key))
    if type(value) is not str or len(value) > MAX_NAME:  # "name"
        raise ValueError(f"{key} is not a string of at most {MAX_NAME} characters")
    return _clean_name(value)


@functools.lru_cache(maxsize=4096)
def _clean_name(name: str) -> str:
    """clean_text, once per distinct name (a trace repeats its kernels' names thousands of times)."""
    return clean_text(name)


def decode_line(line: bytes, number: int = 1) -> Record:
    """One line (without its newline) -> its record; TraceDecodeError (FORGED) otherwise."""
    try:
        if len(line) > MAX_LINE:
            raise ValueError(f"longer than {MAX_LINE} bytes")
        if not line.isascii():
            raise ValueError("not ASCII")
        if not _FLAT_OBJECT.fullmatch(_STRING.sub(b'""', line)):
            raise ValueError("not one flat object")
        data = _DECODER.decode(line.decode("ascii"))
        if type(data) is not dict:
            raise ValueError("not an object")
        kind = data.get("t")
        if type(kind) is not str or kind not in _SCHEMA:
            raise ValueError("an unknown record type")
        cls, fields = _SCHEMA[kind]
        if data.keys() != _KEYS[kind]:
            raise ValueError(f"keys other than a {kind} record's")
        values = {}
        for key, form in fields.items():
            value = data[key]
            if form == "int" and type(value) is int and 0 <= value < INT_LIMIT:
                values[key] = value  # the common case, without a call
            else:
                values[key] = _field(value, key, form)
        record = cls(seq=_int(data["seq"], "seq"), **values)
        if isinstance(record, Hello) and record.v != VERSION:
            raise ValueError(f"version {record.v}, not {VERSION}")
        return record
    except TraceDecodeError:
        raise
    except (ValueError, TypeError, RecursionError, UnicodeError, OverflowError, MemoryError) as exc:
        raise TraceDecodeError(f"line {number} is not a trace record ({clean_text(str(exc))[:80]}): "
                               f"{_shown(line)!r}", kind=FORGED, line=number) from None


def decode(data: bytes, *, max_bytes: int = MAX_BYTES, max_records: int = MAX_RECORDS) -> Trace:
    """The whole buffer -> a Trace. Empty bytes are an empty Trace (the rules say what is
    missing). Raises TraceDecodeError only."""
    try:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TraceDecodeError("the trace is not bytes")
        data = bytes(data)
        if len(data) > max_bytes:
            raise TraceDecodeError(f"the trace is over {max_bytes} bytes", kind=OVERFLOW)
        lines = data.split(b"\n")
        last = lines.pop()  # after the final newline: empty unless the writer stopped mid-line
        if len(lines) + (1 if last else 0) > max_records:
            raise TraceDecodeError(f"the trace has over {max_records} records", kind=OVERFLOW)
        records = tuple(decode_line(line, n) for n, line in enumerate(lines, 1))
        if last:
            raise TraceDecodeError(f"the trace was cut short: its last line ({len(last)} bytes) has no end",
                                   kind=CUT_SHORT, line=len(lines) + 1)
        return Trace(records)
    except TraceDecodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - the contract: nothing but TraceDecodeError leaves
        raise TraceDecodeError(f"the trace could not be read ({type(exc).__name__})") from None
