"""Framed JSON messages between the harness processes.

Nothing coming from a process that runs candidate code is ever unpickled: control messages
are JSON, and tensor payloads are raw bytes read by `transfer.unpack`'s restricted reader.
"""

from __future__ import annotations

import json
from multiprocessing.connection import Connection
from typing import Any


def send(conn: Connection, message: dict[str, Any], payload: bytes | None = None) -> None:
    header = dict(message, _has_payload=payload is not None)
    conn.send_bytes(json.dumps(header, default=str).encode("utf-8"))
    if payload is not None:
        conn.send_bytes(payload)


def recv(conn: Connection, max_header_bytes: int = 16 * 1024 * 1024) -> tuple[dict[str, Any], bytes | None]:
    """One message and its payload. Raises EOFError when the other end is gone, ValueError
    when what arrived is not a message of ours."""
    raw = conn.recv_bytes(max_header_bytes)
    message = json.loads(raw.decode("utf-8"))
    if not isinstance(message, dict):
        raise ValueError("malformed message")
    payload = conn.recv_bytes() if message.pop("_has_payload", False) else None
    return message, payload
