"""Every message between the harness's processes, typed, versioned and bounded, in one place.

Processes and their channels (see the folders of this package):

    caller  <->  server        socketpair; the caller checks the job id and the job's nonce
    server  <->  reference     pipe, one per job; the reference is trusted; nonce'd by the server
    server  <->  candidate     pipe, one per job; the candidate's ONLY channel; its messages are
                               claims, checked against the job's state machine (server/job.py)

A frame is one JSON object (UTF-8) sent with `Connection.send_bytes`, so it carries its own
length; `recv` refuses a frame longer than the channel's bound before reading it. Nothing
is ever unpickled: tensors cross as raw bytes (CPU) or CUDA IPC handles described in JSON
(child/transfer.py). Every frame is parsed by bounded_json.py (depth, lengths, number range
checked before anything reads it). Every message names its `type`; `decode` checks the version, the type
against what the receiver accepts, each field's presence and JSON type, and (where the
channel has one) the job id and nonce. Anything else raises ProtocolError, which the receiver
turns into a verdict about that job (`rejected: protocol` for the candidate's channel, a harness
error otherwise), never into a crash.

Nonces: the caller sends a job's nonce only after the server has forked that job's processes,
and the server draws the reference's nonce after the fork too, so no process that runs
candidate code ever held either in its memory.
"""

from __future__ import annotations

import json
import math
import os
import select
import struct
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from kernelagent.harness.bounded_json import Bounds, Refused, loads as bounded_loads

VERSION = 2

# Bounds on one frame, by channel. A candidate that sends more is cut off (protocol verdict).
MAX_CALLER_FRAME = 64 << 20  # results carry logs (bounded) and the job's sources
MAX_CONTROL_FRAME = 1 << 20  # server <-> reference control messages
MAX_CANDIDATE_FRAME = 1 << 20  # the candidate's claims (timings, flags, IPC handle descriptions)
MAX_PAYLOAD_FRAME = 1 << 30  # raw output bytes on the CPU (smoke-sized inputs), relayed once
# What one message may hold (bounded_json.py): nesting, array and object lengths and integers on
# every channel; on the candidate's, strings too (its longest honest one is a 20,000-character
# failure message).
BOUNDS = Bounds()
CANDIDATE_BOUNDS = Bounds(string=64 << 10)
CANDIDATE_STRING_CLIP = 16 << 10  # what the candidate side cuts its evidence's strings to (json_safe)

_NUM = (int, float)
# type -> {field: allowed python types after json.loads}; every field listed is required.
SCHEMAS: dict[str, dict[str, tuple[type, ...]]] = {
    # caller <-> server
    "hello": {"fingerprint": (dict,), "pid": (int,), "daemon": (dict,)},  # daemon: a warm harness's (listen.py)
    "evaluate": {"config": (dict,), "problem_source": (str,), "candidate_source": (str,),
                 "candidate_sha256": (str,), "want_baselines": (bool,), "options": (dict,)},
    # a problem's baselines timed by a job of their own, beside its candidates' checks (the
    # reference's process only: no candidate, no verdict; docs/concepts/concurrency.md)
    "evaluate_baselines": {"config": (dict,), "problem_source": (str,), "options": (dict,)},
    "started": {},
    "nonce": {"nonce": (str,)},
    "result": {"result": (dict,)},
    # the reference's baseline timings, with the job's nonce, before its slower last stage (the
    # kernel evidence): the caller stores them and lets go of their claim at once
    "baselines_ready": {"baselines": (dict,)},
    "cancel": {},  # the caller gave up on this job: its processes are killed (Dispatcher.cancel)
    "shutdown": {},
    # server -> reference
    # derived: the derived check sets' overrides, drawn after the fork (server/draws.py)
    "ref_nonce": {"nonce": (str,), "derived": (list,)},
    "check": {"name": (str,), "kind": (str,), "seed": (int,), "n_outputs": (int,), "outputs": (list,),
              "inputs": (list,), "stop_on_failure": (bool,),
              # an extra input set the candidate raised on (then no outputs): what it raised
              "candidate_error": (str, type(None)),
              "keep_cache": (bool,)},  # no torch.cuda.empty_cache after it (the timed loop's segments)
    "calibrate": {"seed": (int,), "calls": (int,), "warmup_calls": (int,), "keep": (int,), "segments": (int,),
                  "budget_bytes": (int,), "l2_bytes": (int, type(None)), "payloads": (bool,)},
    "go": {"seed": (int,)},
    "baselines": {"compile_modes": (list,), "l2_bytes": (int, type(None)), "inductor_dir": (str,),
                  "triton_dir": (str,), "seed": (int,), "budget_bytes": (int,)},
    "idle_probe": {},
    "exit": {},
    # reference -> server
    # copy_us: the median device time of a pass over twice the L2 (memory bandwidth), or null
    "idle": {"us": _NUM, "idle": (bool,), "copy_us": _NUM + (type(None),)},
    "ref_ready": {"n_extra": (int,), "extra_plan": (list,), "extra_skipped": (dict,), "alt": (bool,),
                  "near_one": (bool,), "input_bytes": (int,), "output_bytes": (int,),
                  "output_dtype": (str,), "flops": _NUM + (type(None),), "param_bytes": (int,),
                  "reference_ops": (list,), "estimate_ms": _NUM, "memory": (dict,),
                  "extra_bytes": (dict,)},  # a derived set's own input + output bytes, by kind
    "ref_error": {"kind": (str,), "message": (str,)},
    "verdict": {"name": (str,), "kind": (str,), "seed": (int,), "passed": (bool,), "message": (str,),
                "max_abs_err": _NUM + (type(None),), "max_rel_err": _NUM + (type(None),),
                "rel_l2_err": _NUM + (type(None),), "rejected": (str, type(None)), "harness_error": (bool,),
                "skipped": (bool,), "precision": (str,)},
    "warmed": {"kept": (list,)},
    # payload_bytes: the kept outputs' byte frames that follow (order "payloads"), else []
    "calibrated": {"seconds": _NUM, "calls": (int,), "payload_bytes": (list,)},
    # overhead_ms: each baseline's empty-call time (its per-call overhead), null where unmeasured
    "baseline_timings": {"timings": (dict,), "errors": (dict,), "overhead_ms": (dict,)},
    "ref_stats": {"memory": (dict,)},
    # server -> candidate
    "plan": {"reference_ops": (list,)},
    # overrides: a derived set's, sent with its own check only (server/draws.py); else null
    "run_check": {"name": (str,), "kind": (str,), "seed": (int,), "overrides": (dict, type(None))},
    "check_reply": {"passed": (bool,), "stop": (bool,)},
    "time": {"seed": (int,), "calls": (int,), "warmup_calls": (int,), "keep": (int,), "segments": (int,),
             "budget_bytes": (int,), "l2_bytes": (int, type(None)), "payloads": (bool,)},
    "finish": {"profile": (bool,), "device_share": (bool,)},
    # candidate -> server (claims)
    "stage": {"stage": (str,)},
    "compiled": {},
    "outputs": {"name": (str,), "n_outputs": (int,), "outputs": (list,), "inputs": (list,),
                "error": (str, type(None))},  # extra input sets only: the exception instead of outputs
    # event_ms: [the empty event pair's time], overhead_ms: an empty call's host time beyond it
    "timing": {"samples_ms": (list,), "event_ms": (list,), "overhead_ms": _NUM, "calls": (int,),
               "kept": (list,), "meaningful": (bool,)},
    "kernels": {"kernels": (list,)},
    "failure": {"kind": (str,), "stage": (str,), "message": (str,), "flags": (list,)},
    "done": {"flags": (list,), "memory": (dict,)},
}


class ProtocolError(Exception):
    """A frame that is not a well-formed message of the expected kind on this channel."""


class FrameTimeout(Exception):
    """The sender began a frame and did not finish it before the reader's deadline."""


class TruncatedFrame(EOFError):
    """The channel closed in the middle of a frame (the sender died, or closed it, mid-message)."""


def encode(msg_type: str, job: str, nonce: str | None = None, /, **fields: Any) -> bytes:
    if msg_type not in SCHEMAS:
        raise ValueError(f"unknown message type {msg_type!r}")
    message = {"v": VERSION, "type": msg_type, "job": job, **fields}
    if nonce is not None:
        message["nonce"] = nonce
    # allow_nan=False: NaN/Infinity are not JSON; a float field must be finite or null.
    return json.dumps(message, allow_nan=False, separators=(",", ":")).encode("utf-8")


def decode(raw: bytes, accept: set[str] | frozenset[str], job: str | None = None,
           nonce: str | None = None, bounds: Bounds = BOUNDS) -> dict[str, Any]:
    """The message in `raw`, checked: JSON within `bounds` (bounded_json.py: depth, lengths,
    integers within +-2**63, every number finite) before anything else reads it, version, a
    type in `accept`, the job id and nonce when given, and every field of its schema with the
    right JSON type. Unknown fields are refused too, so that nothing unexpected is ever read
    by mistake."""
    try:
        message = bounded_loads(raw, bounds)
    except Refused as exc:
        raise ProtocolError(f"not a JSON message of ours: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("a message must be a JSON object")
    if message.get("v") != VERSION:
        raise ProtocolError(f"protocol version {message.get('v')!r}, expected {VERSION}")
    kind = message.get("type")
    if kind not in accept:
        raise ProtocolError(f"unexpected message type {str(kind)[:40]!r} here")
    if job is not None and message.get("job") != job:
        raise ProtocolError("message for another job")
    if nonce is not None and message.get("nonce") != nonce:
        raise ProtocolError("message without this job's nonce")
    schema = SCHEMAS[kind]
    allowed = set(schema) | {"v", "type", "job", "nonce"}
    extra = set(message) - allowed
    if extra:
        raise ProtocolError(f"{kind}: unexpected fields {sorted(extra)[:5]}")
    for name, types in schema.items():
        if name not in message:
            raise ProtocolError(f"{kind}: missing field {name!r}")
        value = message[name]
        if isinstance(value, bool) and bool not in types:
            raise ProtocolError(f"{kind}: field {name!r} has the wrong type")
        if not isinstance(value, types):
            raise ProtocolError(f"{kind}: field {name!r} has the wrong type")
        if isinstance(value, float) and not math.isfinite(value):
            raise ProtocolError(f"{kind}: field {name!r} is not finite")
    return message


def json_safe(value: Any, depth: int = 0, max_str: int | None = None) -> Any:
    """A copy of `value` that `encode` accepts: non-finite floats become None, tuples lists,
    other objects their str(); with `max_str`, every string cut to that many characters (what
    the candidate's process sends stays within CANDIDATE_BOUNDS)."""
    if depth > 24:
        return None
    if isinstance(value, dict):
        return {str(k)[:max_str]: json_safe(v, depth + 1, max_str) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, depth + 1, max_str) for v in value]
    if isinstance(value, str):
        return value[:max_str]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= BOUNDS.int_abs:
        return None  # beyond what any receiver accepts
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return str(value)[:max_str]


def send(conn: Connection, msg_type: str, job: str, nonce: str | None = None, /, **fields: Any) -> None:
    conn.send_bytes(encode(msg_type, job, nonce, **fields))


def recv(conn: Connection, accept: set[str] | frozenset[str], job: str | None = None, nonce: str | None = None,
         max_bytes: int = MAX_CONTROL_FRAME, remaining: Callable[[], float] | None = None,
         bounds: Bounds = BOUNDS) -> dict[str, Any]:
    """One checked message. EOFError when the other end is gone; ProtocolError for anything
    that is not a message of ours (including a frame over `max_bytes`). With `remaining` (the
    seconds left to the reader's deadline), the frame is read by `read_frame`: bounded in time
    as well as in size, as every read of a hostile sender must be."""
    if remaining is not None:
        return decode(read_frame(conn, max_bytes, remaining), accept, job, nonce, bounds)
    try:
        raw = conn.recv_bytes(max_bytes)
    except OSError as exc:
        if "too long" in str(exc).lower() or "bad message length" in str(exc).lower():
            raise ProtocolError(f"frame longer than {max_bytes} bytes") from None
        raise
    return decode(raw, accept, job, nonce, bounds)


def read_frame(conn: Connection, max_bytes: int, remaining: Callable[[], float]) -> bytearray:
    """One frame of `Connection.send_bytes`'s format (a 4-byte big-endian length, or -1 and an
    8-byte one), read from the raw descriptor with a deadline.

    `Connection.recv_bytes` blocks until the whole frame has come: a sender that writes a
    length and then stops (alive) held the server's job thread past every stage limit, and one
    that then exits raised a bare OSError the server took for its own failure. Here the length
    is checked against `max_bytes` before anything is allocated, each read waits at most
    `remaining()` seconds (FrameTimeout after that), and a channel that closes mid-frame raises
    TruncatedFrame (an EOFError: the sender is gone). A closed channel before the first byte
    is a plain EOFError, as with `recv_bytes`."""
    fd = conn.fileno()
    header = _read_exact(fd, 4, remaining, start=True)
    (size,) = struct.unpack("!i", header)
    if size == -1:
        (size,) = struct.unpack("!Q", _read_exact(fd, 8, remaining))
    if size < 0:
        raise ProtocolError("bad frame length")
    if size > max_bytes:
        raise ProtocolError(f"frame longer than {max_bytes} bytes")
    return _read_exact(fd, size, remaining)


def _read_exact(fd: int, size: int, remaining: Callable[[], float], start: bool = False) -> bytearray:
    # The buffer grows with what has arrived (doubling), never with what the header claims: a
    # 4-byte header alone must not make the reader allocate its bound.
    buffer = bytearray(min(size, 1 << 20))
    view = memoryview(buffer)
    got = 0
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while got < size:
        left = remaining()
        if left <= 0 or not poller.poll(max(1, min(int(left * 1000), 500))):
            if remaining() <= 0:
                raise FrameTimeout(f"the sender stopped {got} bytes into a {size}-byte read")
            continue
        if got == len(buffer):
            del view
            buffer.extend(bytes(min(len(buffer), size - len(buffer))))
            view = memoryview(buffer)
        try:
            n = os.readv(fd, [view[got:]])
        except BlockingIOError:
            continue
        except ConnectionResetError:  # the sender closed its end with our messages unread: gone
            n = 0
        if n == 0:
            if start and got == 0:
                raise EOFError
            raise TruncatedFrame(f"the channel closed {got} bytes into a {size}-byte read")
        got += n
    del view
    return buffer  # no copy: payload frames may be large


def send_payload(conn: Connection, data: bytes | memoryview) -> None:
    """Raw bytes that follow a message announcing them (CPU outputs)."""
    conn.send_bytes(data)


def recv_payload(conn: Connection, max_bytes: int = MAX_PAYLOAD_FRAME,
                 remaining: Callable[[], float] | None = None) -> bytes | bytearray:
    if remaining is not None:
        return read_frame(conn, max_bytes, remaining)
    try:
        return conn.recv_bytes(max_bytes)
    except OSError as exc:
        if "too long" in str(exc).lower() or "bad message length" in str(exc).lower():
            raise ProtocolError(f"payload longer than {max_bytes} bytes") from None
        raise
