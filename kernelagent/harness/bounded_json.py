"""JSON from a process we do not trust, bounded before anything touches it (issue 54, class 5).

The one decoder under protocol.decode, so under every message any of the harness's processes
reads (the candidate's claims above all). `json.loads` alone recursed once per level (a
200,000-deep array was a RecursionError in the server: a harness error, a failing candidate's
verdict laundered), turned `1e400` into inf, and gave 10**400 as a Python int, which the first
`math.isfinite` or `float` on it raised OverflowError for. Here, in this order:

1. the nesting depth is measured on the raw bytes (strings skipped, linear, no recursion);
2. the text is parsed with every integer checked against `Bounds.int_abs` before it is built
   (its digits counted first) and every number with a fraction or exponent finite;
3. every array's and object's length, and every string's (keys included), is checked without
   recursion.

Any failure is `Refused` (a ValueError) with one line saying which bound; protocol.decode turns
it into a ProtocolError, which on the candidate's channel is `rejected: protocol`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from itertools import accumulate
from typing import Any


@dataclass(frozen=True)
class Bounds:
    depth: int = 32  # arrays and objects inside one another; our messages use fewer than 10
    items: int = 100_000  # elements of one array, members of one object
    string: int | None = None  # characters of one string or key; None: the frame's own bound
    int_abs: int = 2**63  # |an integer| below this (byte counts, seeds, counts)


class Refused(ValueError):
    """A text that is not bounded JSON."""


# A JSON string token, or an unterminated one to the end (which JSON refuses anyway): matching
# the rest of the text at once keeps the scan linear where a lone quote would have it retried.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
_STEP = tuple(1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256))
_INT_DIGITS_MAX = 19  # 2**63 has 19 digits: anything longer is refused before int() runs


def nesting_depth(data: bytes | bytearray, limit: int) -> int:
    """How deep arrays and objects nest in `data` (at most what its brackets allow), read off the
    raw bytes: brackets inside strings do not count. Returns early, without a scan, when the
    text holds no more brackets than `limit`."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return 0
    skeleton = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, skeleton)), default=0)


def loads(raw: bytes | bytearray, bounds: Bounds = Bounds()) -> Any:
    """The value in `raw` (UTF-8 JSON), within `bounds`; Refused otherwise."""
    depth = nesting_depth(raw, bounds.depth)
    if depth > bounds.depth:
        raise Refused(f"nested {depth} levels deep (at most {bounds.depth})")
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("not UTF-8") from None

    def parse_int(digits: str) -> int:
        if len(digits.lstrip("-")) > _INT_DIGITS_MAX:
            raise Refused(f"an integer of {len(digits)} digits (at most {_INT_DIGITS_MAX})")
        value = int(digits)
        if not -bounds.int_abs < value < bounds.int_abs:
            raise Refused(f"an integer out of range ({digits[:24]})")
        return value

    try:
        value = json.loads(text, parse_int=parse_int, parse_float=_finite_float, parse_constant=_constant)
    except Refused:
        raise
    except RecursionError:  # the pre-scan counts exactly for valid JSON: this is invalid text
        raise Refused("nested too deep") from None
    except ValueError as exc:
        raise Refused(f"not JSON ({exc.__class__.__name__}: {str(exc)[:80]})") from None
    _check_sizes(value, bounds)
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Refused(f"a number out of range ({text[:24]})")
    return value


def _constant(name: str) -> Any:
    raise Refused(f"{name} is not JSON")


def _check_sizes(value: Any, bounds: Bounds) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if bounds.string is not None and len(item) > bounds.string:
                raise Refused(f"a string of {len(item):,} characters (at most {bounds.string:,})")
        elif isinstance(item, list):
            if len(item) > bounds.items:
                raise Refused(f"an array of {len(item):,} elements (at most {bounds.items:,})")
            stack.extend(item)
        elif isinstance(item, dict):
            if len(item) > bounds.items:
                raise Refused(f"an object of {len(item):,} members (at most {bounds.items:,})")
            stack.extend(item.keys())
            stack.extend(item.values())
