"""Asking a zygote (server/zygote.py) for a harness server instead of starting a Python process:
the same server with torch already imported. Used where KERNELAGENT_SERVER_ZYGOTE names the
zygote's socket (tests/conftest.py starts one per pytest worker), for a server on the host itself.

`spawn` returns the little of subprocess.Popen that the Evaluator uses (pid, poll, wait,
returncode); the server is the zygote's child, and the zygote reports its exit status.
"""

from __future__ import annotations

import array
import json
import os
import select
import socket
import subprocess
import time
from typing import Any

from kernelagent import settings
from kernelagent.harness import interpreter
from kernelagent.harness.caller import pids

ENV = "KERNELAGENT_SERVER_ZYGOTE"
MODULE = "kernelagent.harness.server"


class ZygoteError(RuntimeError):
    """The zygote named by KERNELAGENT_SERVER_ZYGOTE did not start a server."""


def address() -> str | None:
    return settings.get(ENV)


class ZygoteProcess:
    """A server the zygote forked: its pid (it leads its own session), and its exit status when
    the zygote says it ended."""

    def __init__(self, pid: int, conn: socket.socket, buffered: bytes):
        self.pid = pid
        self.args = ["zygote", str(pid)]
        self.returncode: int | None = None
        self._conn: socket.socket | None = conn
        self._buffer = buffered

    def _read(self, timeout: float) -> None:
        if self.returncode is not None:
            return
        if self._conn is None:  # the zygote went away: the server's pid is all there is
            if not pids.alive(self.pid):
                self.returncode = -9
            else:
                time.sleep(min(timeout, 0.05))
            return
        if b"\n" not in self._buffer and select.select([self._conn], [], [], max(0.0, timeout))[0]:
            try:
                chunk = self._conn.recv(4096)
            except OSError:
                chunk = b""
            if not chunk:
                self._conn.close()
                self._conn = None
                return
            self._buffer += chunk
        if b"\n" in self._buffer:
            try:
                self.returncode = int(json.loads(self._buffer.split(b"\n", 1)[0])["exit"])
            except (ValueError, KeyError, TypeError):
                self.returncode = -1
            self._conn.close()
            self._conn = None

    def poll(self) -> int | None:
        self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        until = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 1.0 if until is None else until - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._read(min(left, 1.0))
        return self.returncode


def spawn(where: str, cmd: list[str], env: dict[str, str], chan: int, log: int, timeout: float = 30.0,
          *, cwd: str | os.PathLike) -> ZygoteProcess:
    """The server of `cmd` (interpreter.module_argv's for kernelagent.harness.server, with
    --fd), forked by the zygote at `where`, in `cwd` (the server's own folder, never the
    user's), with `chan` as its channel and `log` as its stdout and stderr."""
    found = interpreter.module_of(cmd)
    if found is None or found[0] != MODULE:
        raise ZygoteError(f"not a harness server's command line: {cmd[:2]}")
    request: dict[str, Any] = {"executable": cmd[0], "argv": found[1], "env": env, "cwd": os.fspath(cwd)}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(where)
        conn.sendmsg([json.dumps(request).encode()],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [chan, log]).tobytes())])
        buffer = b""
        while b"\n" not in buffer:
            chunk = conn.recv(4096)
            if not chunk:
                raise ZygoteError("the zygote closed the connection without a reply")
            buffer += chunk
        line, rest = buffer.split(b"\n", 1)
        reply = json.loads(line)
        if "pid" not in reply:
            raise ZygoteError(f"the zygote refused: {str(reply.get('error'))[:300]}")
        conn.settimeout(None)
        return ZygoteProcess(int(reply["pid"]), conn, rest)
    except (OSError, ValueError, TypeError) as exc:
        conn.close()
        raise ZygoteError(f"the zygote at {where} did not answer: {exc}") from None
    except BaseException:
        conn.close()
        raise
