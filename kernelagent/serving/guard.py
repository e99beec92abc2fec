"""The guard in front of both HTTP servers: one ASGI wrapper, with no Starlette or uvicorn import.

For each HTTP request, before the app sees it (its headers over `max_header_bytes`: 431; h11
refuses a head that grows past it before it ends, 400):
1. **the bearer token** (when the server has one): exactly one `Authorization: Bearer TOKEN`
   header, compared as bytes in constant time (`hmac.compare_digest` on bytes takes any byte).
   Anything else (missing, repeated, another scheme, no space or two, non-ASCII or control
   bytes, a wrong token) is 401 with `WWW-Authenticate: Bearer`, never an exception: a str
   comparison raised TypeError on a non-ASCII byte (a 500 and a traceback in the log);
2. **the body's size**: a Content-Length over `max_body` is 413 at once to a client that sent
   `Expect: 100-continue` (it never sends the body: the server sends `100 Continue` only when
   the body is read), and otherwise after the body is read and dropped (up to `drain_factor`
   times the limit, within the read timeout), so that the client reads the 413 rather than a
   broken pipe. A body without a length (chunked) is counted as it arrives: 413 when it passes;
3. **the body's time**: the whole body must arrive within `read_timeout` seconds, else 408.
   (The head's own timeout, and its size, are the server's: server.py.)

The body, read once here, is handed to the app whole; the app's later `receive()` calls go to
the connection, so an app still learns when its client goes away. A client that disconnects
while sending is dropped: there is no one to answer. Every error here is a JSON object
`{"error": ...}` and closes the connection.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

ASGIApp = Callable[[dict, Callable, Callable], Awaitable[None]]

# Every status the shared stack answers itself, before an app sees the request (docs/hooks.py
# renders this table into the serve and MCP guides; tests/test_serve_load.py holds each one).
STATUSES = {
    400: "a request the HTTP parser (h11) refuses: a bad request line or header line, a bad or repeated "
         "Content-Length, a NUL byte, a head that grows past the header limit (16 KiB) before it ends; "
         "plain text",
    401: "no valid bearer token: exactly one `Authorization: Bearer TOKEN` header is required; any other "
         "(missing, repeated, another scheme, stray spaces or bytes) gets `WWW-Authenticate: Bearer`",
    408: "the request's head or body did not arrive within the read timeout (a connection that sent "
         "nothing is closed without an answer)",
    413: "a body over the size limit: answered before the body is sent to a client that sent `Expect: "
         "100-continue`, otherwise after reading and dropping it (up to 4x the limit)",
    431: "headers over the header limit (16 KiB) that arrived whole",
    503: "more connections open at once than the limit (plain text); the connection is closed",
}

UNAUTHORIZED = "a bearer token is required (Authorization: Bearer <token>)"


@dataclass(frozen=True)
class Limits:
    """The limits both servers run under (their defaults are the same but for max_body)."""

    max_body: int = 64 * 1024 * 1024  # bytes of one request's body (413 past it)
    read_timeout: float = 60.0  # seconds for a request's head, and again for its body (408)
    max_connections: int = 512  # open at once (uvicorn's limit_concurrency): 503 past it
    keep_alive: float = 5.0  # seconds an idle connection is kept after a response
    max_header_bytes: int = 16 * 1024  # a request's head (h11's max incomplete event size): 400 past it
    drain_factor: int = 4  # an over-limit body is read and dropped up to this many times max_body
    shutdown_grace: float = 5.0  # seconds requests in flight get to finish when the server stops


def authorized(headers: Any, expected: bytes) -> bool:
    """Whether ASGI `headers` ([(name, value) bytes pairs]) hold exactly one Authorization
    header of the form `Bearer <expected>` (the scheme's case aside)."""
    try:
        values = [value for name, value in headers if bytes(name).lower() == b"authorization"]
    except (TypeError, ValueError):
        return False
    if len(values) != 1 or not isinstance(values[0], (bytes, bytearray)):
        return False
    scheme, space, credential = bytes(values[0]).partition(b" ")
    if not space or scheme.lower() != b"bearer" or not credential:
        return False
    return hmac.compare_digest(credential, expected)


async def reply(send: Callable, status: int, message: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    """Answer `{"error": message}` with `status` and close the connection."""
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": body})


def guard(app: ASGIApp, limits: Limits, token: str | None = None) -> ASGIApp:
    """`app` behind the token (None: no token) and the body's limits."""
    expected = token.encode("utf-8") if token else None

    async def guarded(scope: dict, receive: Callable, send: Callable) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket"):  # lifespan
            await app(scope, receive, send)
            return
        headers = scope.get("headers") or []
        if sum(len(name) + len(value) + 4 for name, value in headers) > limits.max_header_bytes:
            await reply(send, 431, f"the request's headers are over {limits.max_header_bytes} bytes")
            return
        if expected is not None and not authorized(headers, expected):
            if kind == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            else:
                await reply(send, 401, UNAUTHORIZED, [(b"www-authenticate", b"Bearer")])
            return
        if kind == "websocket":
            await app(scope, receive, send)
            return
        body = await _read_body(headers, receive, send, limits)
        if body is not None:
            await app(scope, _replay(body, receive), send)

    return guarded


async def _read_body(headers: list, receive: Callable, send: Callable, limits: Limits) -> bytes | None:
    """The request's whole body; None when it was answered here (408, 413) or the client left."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.read_timeout
    length = _content_length(headers)
    too_large = f"body over {limits.max_body} bytes"
    cap = limits.drain_factor * limits.max_body
    if length is not None and length > limits.max_body:
        if not any(n.lower() == b"expect" and v.lower() == b"100-continue" for n, v in headers):
            await _drain(receive, min(length, cap), deadline)
        await reply(send, 413, too_large)
        return None
    chunks, size = [], 0
    while True:
        message = await _receive_by(receive, deadline)
        if message is None:
            await reply(send, 408, f"the request's body did not arrive within {limits.read_timeout:g} s "
                                   f"({size}{'' if length is None else f'/{length}'} bytes)")
            return None
        if message.get("type") != "http.request":  # http.disconnect: no one to answer
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limits.max_body:
            if message.get("more_body", False):
                await _drain(receive, cap - size, deadline)
            await reply(send, 413, too_large)
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _drain(receive: Callable, left: int, deadline: float) -> None:
    """Read and drop up to `left` more bytes of the body, until the deadline."""
    while left > 0:
        message = await _receive_by(receive, deadline)
        if message is None or message.get("type") != "http.request":
            return
        left -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


async def _receive_by(receive: Callable, deadline: float) -> dict | None:
    remaining = deadline - asyncio.get_running_loop().time()
    if remaining <= 0:
        return None
    try:
        return await asyncio.wait_for(receive(), remaining)
    except asyncio.TimeoutError:
        return None


def _content_length(headers: list) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the parser refused it already (400); a body is counted either way
    return None


def _replay(body: bytes, receive: Callable) -> Callable[[], Awaitable[dict]]:
    """A receive() that gives the body read here, then the connection's own messages."""
    given = False

    async def replayed() -> dict:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
