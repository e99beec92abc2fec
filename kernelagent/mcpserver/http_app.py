"""`kernelagent mcp --http`: the SDK's streamable HTTP app (Starlette, at /mcp) on the stack that
`kernelagent serve` runs on too (kernelagent/serving): the same bearer-token check, limits and
statuses, and uvicorn configured by the same code. No MCP import: `server` is the MCPServer.
"""

from __future__ import annotations

from typing import Any

from kernelagent.serving.guard import Limits, guard

# A JSON-RPC message carries at most a module's code: the SDK's own default body limit (4 MiB),
# which the guard applies before the SDK reads anything. The other limits are the shared ones.
LIMITS = Limits(max_body=4 * 1024 * 1024)

# What the SDK's transport (mcp.server.streamable_http) answers itself, besides the shared
# stack's statuses (serving/guard.py STATUSES); docs/hooks.py renders both into the MCP guide.
STATUSES = {
    200: "a JSON-RPC reply (an SSE stream, or JSON)",
    202: "a notification or a client's response, accepted",
    400: "not JSON-RPC, or a request without its session's `Mcp-Session-Id`",
    403: "an `Origin` header the server does not allow",
    404: "an unknown or ended session: start a new one; or a path other than /mcp",
    405: "a method /mcp does not take",
    406: "an `Accept` header without both application/json and text/event-stream",
    409: "a second GET stream for one session",
    415: "a `Content-Type` other than application/json",
    421: "a `Host` header that does not name this server (DNS rebinding protection)",
    500: "an error inside the transport",
    503: "too many open sessions, besides too many connections",
}


def app(server: Any, host: str, token: str | None, limits: Limits = LIMITS) -> Any:
    """The ASGI app: the SDK's streamable HTTP app behind the shared guard."""
    return guard(server.streamable_http_app(host=host, max_request_body_size=limits.max_body), limits, token)


def http_server(server: Any, host: str, port: int, token: str | None, limits: Limits = LIMITS) -> Any:
    """A serving.server.Server for `server` on HOST:PORT, its socket bound (OSError: not free)."""
    from kernelagent.serving.server import Server

    return Server(app(server, host, token, limits), host, port, limits, lifespan="on")
