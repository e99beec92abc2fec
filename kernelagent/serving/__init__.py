"""One HTTP stack under both servers: `kernelagent serve` (rl/service.py) and `kernelagent mcp
--http` (mcpserver/http_app.py) are Starlette apps on uvicorn, behind the same guard and limits.

    guard.py    the ASGI guard in front of both apps: the bearer-token check, the body limit
                (bytes counted as they arrive), the body's read timeout, the error statuses and
                the Limits they share (no Starlette or uvicorn import)
    server.py   uvicorn configured from Limits: connections at once, keep-alive, the head's size
                and read timeout; a Server that binds before it runs and stops cleanly on a signal

Neither rl/ nor mcpserver/ imports the other; both import this. Starlette and uvicorn come with
the `rl` and `mcp` extras and are imported only by a server that starts (`require` first).
"""

from __future__ import annotations


def require(command: str, extra: str) -> None:
    """Raise UserError (one line, exit 2) when Starlette or uvicorn cannot be imported."""
    import importlib

    from kernelagent.errors import UserError

    missing = []
    for name in ("starlette", "uvicorn"):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise UserError(f"{command} needs {' and '.join(missing)}: pip install 'kernelagent[{extra}]'")
