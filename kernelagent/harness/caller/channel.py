"""The caller's socket to its harness server (mixed into caller/evaluator.py's Evaluator): one
reader thread routes each `started`, `baselines_ready` and `result` to the thread waiting for
that job; a job is sent, given its nonce once forked, and waited for within its deadline; a
caller that gives up cancels that job alone; a server silent past a deadline, or one that breaks
the protocol, goes.

**Only the reader closes the socket it reads.** Another thread that ends the connection (close,
a killed or hung server, a warm harness let go) shuts it down (`hang_up`): the reader hears the
end and closes it. Closed under the reader by another thread, the descriptor's number went to
the next socket this process opened, which is the next server's channel when an evaluator
closes and another starts (a warm harness's command, then a private one), and the old reader,
caught between taking the number and reading, read the new channel's bytes: its frames came
apart ("the harness server died" half a second into a job) or a reply was never heard (a job
abandoned for want of its nonce, the caller waiting out its deadline). tests/test_channel_close.py.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from kernelagent.harness import protocol
from kernelagent.text import clean_text

CANCEL_POLL_S = 0.2
CANCEL_WAIT_S = 30.0
READER_JOIN_S = 5.0  # how long a hang-up waits for the reader to close the socket


class ServerChannel:
    """Evaluator's round trips (needs its _conn, _proc, _lock, _send_lock, _pending, _heard,
    _reader, _reader_conn and _kill_server)."""

    def _read(self, conn: Connection) -> None:
        """The socket's one reader: each `started` and `result` goes to the thread waiting for
        that job; when the server is gone (or the connection was hung up), every waiting thread
        hears None, and this thread closes the socket (no other does: module docstring)."""
        ending: dict[str, Any] | None = None  # the end of the stream: None; a frame that came apart: why
        try:
            while True:
                try:
                    message = protocol.recv(conn, {"started", "baselines_ready", "result"},
                                            max_bytes=protocol.MAX_CALLER_FRAME)
                except (EOFError, OSError):
                    break
                except (protocol.ProtocolError, ValueError, TypeError) as exc:
                    ending = {"type": "unreadable", "why": clean_text(f"{type(exc).__name__}: {exc}")[:200]}
                    break
                self._heard = time.monotonic()  # the server is alive and answering (queued jobs wait on this)
                entry = self._pending.get(str(message.get("job")))
                if entry is not None and entry[1] is conn:
                    entry[0].put(message)
        finally:
            for box, sent_on in list(self._pending.values()):
                if sent_on is conn:
                    box.put(ending)
            conn.close()

    def start_reader(self, conn: Connection) -> None:
        """The reader of `conn` (the connection just greeted), the one thread that closes it."""
        self._reader = threading.Thread(target=self._read, args=(conn,), name="kernelagent-harness-reader",
                                        daemon=True)
        self._reader_conn = conn
        self._reader.start()

    def hang_up(self, conn: Connection | None) -> None:
        """End `conn` from any thread: shut the socket down, which wakes its reader with the end of
        the stream; the reader closes it (waited for up to READER_JOIN_S; where it is slower it
        still closes it itself). A connection no reader reads (its greeting failed) closes here."""
        if conn is None or conn.closed:
            return
        shut_down(conn)
        if self._reader is not None and self._reader_conn is conn:
            if self._reader is not threading.current_thread():
                self._reader.join(READER_JOIN_S)
            return
        conn.close()

    def _round_trip(self, request: dict[str, Any], deadline_s: float,
                    cancel: threading.Event | None = None,
                    on_baselines: Callable[[dict[str, Any]], None] | None = None,
                    kind: str = "evaluate") -> dict[str, Any] | None:
        """Send one job, give it its nonce once the server has forked it, and wait for the
        result that carries both. Several jobs share the socket (the reader thread routes the
        replies). A job past its overall deadline means a server that stopped answering: it is
        killed (the jobs in flight with it end as harness errors) and restarted next time. A
        `cancel` set meanwhile ends this job alone ({"cancelled": True}: _cancel_job). The
        baselines may come first, with the nonce too: `on_baselines` gets them. `kind`: the
        request's type (`evaluate_baselines`: a problem's baselines, caller/baseline_jobs.py)."""
        job = secrets.token_hex(8)
        nonce = secrets.token_hex(16)
        box: queue.Queue[dict[str, Any] | None] = queue.Queue()
        conn, proc = self._conn, self._proc
        try:
            if conn is None:
                return {"error": "the harness server is not running"}
            self._pending[job] = (box, conn)
            try:
                with self._send_lock:
                    protocol.send(conn, kind, job, **request)
                started = self._until_started(box, deadline_s, cancel)
                if started is not None and started.get("type") == "cancelled":
                    return self._cancel_job(conn, job, box)
                if started is None or started.get("type") != "started":
                    return self._lost(proc, started)
                # The job's own deadline runs from its admission: a job queued behind others
                # (admission, device memory) is not charged for their time.
                until = time.monotonic() + deadline_s
                with self._send_lock:
                    protocol.send(conn, "nonce", job, nonce=nonce)
                message = self._next(box, until, cancel)
                while message is not None and message.get("type") == "baselines_ready":
                    if message.get("nonce") != nonce:
                        self._kill_server_if(proc, misbehaved=True)
                        return {"error": "the harness server sent baselines without this job's nonce; it was "
                                         "killed and will be restarted"}
                    if on_baselines is not None:
                        try:
                            on_baselines(message["baselines"])
                        except Exception:  # noqa: BLE001 - the result carries them again
                            pass
                    message = self._next(box, until, cancel)
                if message is not None and message.get("type") == "cancelled":
                    return self._cancel_job(conn, job, box)
                if message is None or message.get("type") != "result":
                    return self._lost(proc, message)
                if message.get("nonce") != nonce:
                    self._kill_server_if(proc, misbehaved=True)
                    return {"error": "the harness server sent a result without this job's nonce; it was killed and "
                                     "will be restarted"}
                return {"result": message["result"]}
            except (EOFError, OSError) as exc:
                self._kill_server_if(proc)
                return {"error": f"the harness server died ({exc}); it will be restarted for the next evaluation"}
        finally:
            self._pending.pop(job, None)

    def _until_started(self, box: "queue.Queue[dict[str, Any] | None]", quiet_s: float,
                       cancel: threading.Event | None = None) -> dict[str, Any] | None:
        """The job's `started`: it may wait in the server's queue as long as the server keeps
        answering other jobs; a server silent for `quiet_s` (one job's deadline) has hung."""
        since = time.monotonic()
        while True:
            heard = max(since, self._heard)
            message = self._next(box, min(heard + quiet_s, time.monotonic() + 5.0), cancel)
            if message is None or message.get("type") != "deadline":
                return message
            if time.monotonic() >= max(since, self._heard) + quiet_s:
                return message

    @staticmethod
    def _next(box: "queue.Queue[dict[str, Any] | None]", until: float,
              cancel: threading.Event | None = None) -> dict[str, Any] | None:
        while cancel is not None and not cancel.is_set():  # watched in short waits
            left = until - time.monotonic()
            if left <= 0:
                return {"type": "deadline"}
            try:
                return box.get(timeout=min(left, CANCEL_POLL_S))
            except queue.Empty:
                continue
        if cancel is not None:
            return {"type": "cancelled"}
        try:
            message = box.get(timeout=max(0.0, until - time.monotonic()))
        except queue.Empty:
            return {"type": "deadline"}
        return message

    def _cancel_job(self, conn: Connection, job: str, box: "queue.Queue[dict[str, Any] | None]") -> dict[str, Any]:
        """The caller gave up on `job`: the server kills its processes and nothing else
        (Dispatcher.cancel). Wait a little for the server to say it ended, so that none of its
        processes outlives this call; the server is never killed for it."""
        try:
            with self._send_lock:
                protocol.send(conn, "cancel", job)
        except OSError:
            return {"cancelled": True}
        until = time.monotonic() + CANCEL_WAIT_S
        while True:
            message = self._next(box, until)
            if message is None or message.get("type") in ("result", "deadline", "unreadable"):
                return {"cancelled": True}

    def _lost(self, proc: subprocess.Popen | None, message: dict[str, Any] | None) -> dict[str, Any] | None:
        hung = message is not None and message.get("type") == "deadline"
        self._kill_server_if(proc, misbehaved=hung)
        if hung:
            return None
        if message is not None and message.get("type") == "unreadable":
            return {"error": f"a message of the harness server could not be read ({message.get('why')}); this "
                             "connection to it ended, and the next evaluation starts another"}
        return {"error": "the harness server died; it will be restarted for the next evaluation"}

    def _kill_server_if(self, proc: Any, misbehaved: bool = False) -> None:
        """Kill the server this job was sent to, unless it was already replaced."""
        with self._lock:
            if proc is not None and self._proc is proc:
                self._kill_server(misbehaved)


def shut_down(conn: Connection | None) -> None:
    """Shut `conn`'s socket down for both directions without closing its descriptor (through a
    duplicate): a thread blocked reading it hears the end of the stream, and the peer too."""
    if conn is None:
        return
    with contextlib.suppress(OSError, ValueError):
        duplicate = socket.socket(fileno=os.dup(conn.fileno()))
        with duplicate:
            duplicate.shutdown(socket.SHUT_RDWR)
