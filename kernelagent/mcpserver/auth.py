"""The bearer token in front of `kernelagent mcp --http`: an ASGI wrapper, no MCP import.

Every HTTP request must carry exactly one `Authorization: Bearer TOKEN` header. The header is
compared as bytes (`hmac.compare_digest` on bytes takes any byte, in constant time), so a
credential that is malformed in any way (missing, repeated, another scheme, no space, extra
spaces, non-ASCII or control bytes, a wrong token) is a 401 with a `WWW-Authenticate` header,
never an exception: a str comparison raised TypeError on a non-ASCII byte (a 500 and a
traceback in the log).
"""

from __future__ import annotations

import hmac
import json
from typing import Any, Awaitable, Callable

UNAUTHORIZED = json.dumps({"error": "unauthorized: send Authorization: Bearer <token>"}).encode()


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


def bearer_guard(app: Callable[..., Awaitable[None]], token: str | None) -> Callable[..., Awaitable[None]]:
    """`app` behind the token (no token: `app` itself)."""
    if not token:
        return app
    expected = token.encode("utf-8")

    async def guarded(scope: dict, receive: Callable, send: Callable) -> None:
        if scope.get("type") in ("http", "websocket") and not authorized(scope.get("headers") or [], expected):
            if scope.get("type") == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                    (b"content-length", str(len(UNAUTHORIZED)).encode())]})
            await send({"type": "http.response.body", "body": UNAUTHORIZED})
            return
        await app(scope, receive, send)

    return guarded
