"""uvicorn for both HTTP servers, configured from one Limits (guard.py).

uvicorn's own settings carry most of the limits: `limit_concurrency` (connections open at once:
503 past `max_connections`), `timeout_keep_alive` (an idle connection after a response),
`h11_max_incomplete_event_size` (a request's head: 400 past `max_header_bytes`; h11 also refuses
malformed heads with 400) and `timeout_graceful_shutdown` (requests in flight when it stops).
One bound uvicorn lacks is added here: the time a request's head may take. uvicorn arms no timer
before the first request nor while a head trickles in, so a client that connects and sends
nothing, or a byte a minute, would hold a connection (and one of `max_connections`) for ever.
`HeadTimeoutProtocol` is uvicorn's h11 protocol with that timer (408, or a quiet close when
nothing came), passed to uvicorn as its `http` protocol class.

`Server` binds its socket when it is made (the port is known at once, and a port in use is an
OSError there), serves in a thread (`start`, `serve_forever`/`shutdown`, as socketserver does) or
in the main thread until SIGTERM or SIGINT (`serve_until_signal`): uvicorn's own signal handling
would raise the signal again after its shutdown, ending the process before the caller's cleanup.
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import socket
import threading
import time
from typing import Any, Callable, Iterator

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from kernelagent.serving.guard import Limits


class HeadTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, where a request's head must arrive within `head_timeout` seconds
    of the connection opening or of the previous response: else 408 when part of one came, or a
    quiet close when nothing did (an idle connection has no request to answer)."""

    def __init__(self, *args: Any, head_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout = head_timeout
        self._head_timer: Any = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return  # gone, or a request is under way (its body has the guard's timeout)
        if self.conn.trailing_data[0]:  # part of a head came
            body = json.dumps({"error": f"the request's head did not arrive within {self.head_timeout:g} s"}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]
            try:
                for event in (h11.Response(status_code=408, headers=headers, reason=b"Request Timeout"),
                              h11.Data(data=body), h11.EndOfMessage()):
                    self.transport.write(self.conn.send(event))
            except h11.LocalProtocolError:
                pass
        self.transport.close()


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # Server.serve_until_signal handles them
        yield


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048)


class Server:
    """A uvicorn server for the ASGI `app` on HOST:PORT (0: any free port), under `limits`."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, limits: Limits = Limits(), *,
                 lifespan: str = "off", log_level: str = "warning") -> None:
        self.limits = limits
        self.socket = _listen(host, port)  # OSError: the port is taken, the address is not ours
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]
        config = uvicorn.Config(
            app, http=functools.partial(HeadTimeoutProtocol, head_timeout=limits.read_timeout), ws="none",
            loop="asyncio", lifespan=lifespan, log_config=None, log_level=log_level, access_log=False,
            limit_concurrency=limits.max_connections, timeout_keep_alive=limits.keep_alive,
            h11_max_incomplete_event_size=limits.max_header_bytes,
            timeout_graceful_shutdown=limits.shutdown_grace, server_header=False)
        self.uvicorn = _Uvicorn(config)
        self._serving = False
        self._done = threading.Event()

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self.uvicorn.server_state.connections)

    def serve_forever(self, poll_interval: float = 0.5) -> None:  # noqa: ARG002 - socketserver's signature
        """Serve until shutdown(); uvicorn looks for it every 0.1 s."""
        self._serving = True
        try:
            self.uvicorn.run(sockets=[self.socket])
        finally:
            self._done.set()

    def start(self, timeout: float = 30.0) -> threading.Thread:
        """Serve in a daemon thread; return once it accepts requests."""
        thread = threading.Thread(target=self.serve_forever, name="kernelagent-http", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        while not self.uvicorn.started:
            if self._done.wait(0.01) or time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start")
        return thread

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop serving (requests in flight get `limits.shutdown_grace` seconds) and wait for it."""
        self.uvicorn.should_exit = True
        if self._serving:
            self._done.wait(self.limits.shutdown_grace + 10 if timeout is None else timeout)

    def server_close(self) -> None:
        self.socket.close()

    def serve_until_signal(self, on_stop: Callable[[], None] | None = None,
                           ready: Callable[[], None] | None = None) -> int | None:
        """Serve in this (the main) thread until SIGTERM or SIGINT, and return that signal.
        `ready()` runs once the handlers are in place; the first signal calls `on_stop()` and
        starts a graceful stop; a second SIGINT ends the requests in flight at once."""
        stopped_by: list[int] = []

        def handle(sig: int, _frame: Any) -> None:
            if stopped_by and sig == signal.SIGINT:
                self.uvicorn.force_exit = True
            if not stopped_by:
                stopped_by.append(sig)
                if on_stop is not None:
                    on_stop()
            self.uvicorn.should_exit = True

        previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            if ready is not None:
                ready()
            self.serve_forever()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return stopped_by[0] if stopped_by else None
