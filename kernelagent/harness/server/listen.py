"""A warm harness: the server listening on a Unix socket, for every command of its user.

`python -m kernelagent.harness.server --listen PATH` (started by caller/daemon.py) sets up once
(the device probe, torch, torch._dynamo, the jail) and then serves each connection as the
server serves the caller that started it (server/main.py `Dispatcher`): its own jobs, its own
nonces; every connection's jobs share the device's one gate and admission. A connection that
closes (the command ended, or was interrupted) takes its own jobs with it, never the others'.

Who may connect: the socket lives in a directory only its user can enter (caller/daemon.py
checks it), is created with mode 0600, and every connection's peer credentials (SO_PEERCRED)
must name this process's uid, else it is closed before a word is said. It exits when no
connection and no job has been there for `idle_timeout` seconds, removing its socket (only its
own: the inode it bound).
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import struct
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable


# sun_path holds 108 bytes with its NUL: a longer socket path is reached through the directory's
# descriptor instead (/proc/self/fd/N/NAME), which names the same file.
_SUN_PATH_MAX = 107
# accept() errors that mean the listening socket itself is gone; others (no descriptors or memory
# left, a client that vanished) cost one client.
_ACCEPT_FATAL = frozenset({errno.EBADF, errno.EINVAL, errno.ENOTSOCK, errno.EOPNOTSUPP})


def unix_call(path: Path, call: Callable[[str], Any]) -> Any:
    """`call(address)` (a socket's bind or connect) with an address for `path` that fits sun_path,
    however long the folder's path (KERNELAGENT_RUNTIME_DIR, a test's tmp_path)."""
    if len(os.fsencode(str(path))) <= _SUN_PATH_MAX:
        return call(str(path))
    folder = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return call(f"/proc/self/fd/{folder}/{path.name}")
    finally:
        os.close(folder)


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED), or None."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    _pid, uid, _gid = struct.unpack("3i", raw)
    return uid


class Listener:
    def __init__(self, path: Path, idle_timeout: float):
        self.path, self.idle_timeout = Path(path), max(1.0, float(idle_timeout))
        self.started = time.time()
        self.refused = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            existing = os.lstat(self.path)
        except FileNotFoundError:
            existing = None
        if existing is not None:
            if not stat.S_ISSOCK(existing.st_mode) or existing.st_uid != os.getuid():
                raise RuntimeError(f"{self.path} exists and is not a socket of this user")
            os.unlink(self.path)  # a dead daemon's (the starter holds the directory's lock)
        umask = os.umask(0o177)
        try:
            unix_call(self.path, self.sock.bind)
        finally:
            os.umask(umask)
        self.inode = os.lstat(self.path).st_ino
        self.sock.listen(64)
        self.sock.settimeout(0.5)

    def describe(self) -> dict[str, Any]:
        return {"socket": str(self.path), "pid": os.getpid(), "idle_timeout_s": self.idle_timeout,
                "started": round(self.started, 3)}

    def serve(self, connection: Callable[[Connection], Any], busy: Callable[[], bool]) -> str:
        """Accept until idle: `connection(conn)` greets a new client and returns its dispatcher,
        whose run() is its thread and close() ends its connection; `busy()` says whether any job
        runs. Returns why it stopped (main.py writes it to the harness's log). A client whose
        greeting fails, or an accept that fails for want of descriptors or memory, costs that
        client only: the harness serves the others on."""
        lock = threading.Lock()
        clients: set[int] = set()
        last = [time.monotonic()]

        def run(key: int, dispatcher: Any, conn: Connection) -> None:
            try:
                dispatcher.run()
            finally:
                dispatcher.close()  # under its send lock: its job threads may still be answering
                with lock:
                    clients.discard(key)
                    last[0] = time.monotonic()

        while True:
            try:
                client, _ = self.sock.accept()
            except socket.timeout:
                with lock:
                    idle = not clients and time.monotonic() - last[0] > self.idle_timeout
                if idle and not busy():
                    return f"idle for {self.idle_timeout:.0f} s"
                if not self._still_ours():
                    # Unlinked or replaced (a newer harness of this user took the name): take no
                    # new client; the ones here finish first.
                    with lock:
                        if not clients and not busy():
                            return "its socket was removed or taken by another harness"
                continue
            except OSError as exc:
                if exc.errno in _ACCEPT_FATAL or self.sock.fileno() < 0:
                    return f"its socket failed: {exc}"
                print(f"kernelagent harness: accept failed ({exc}); serving on", file=sys.stderr, flush=True)
                time.sleep(0.1)
                continue
            if peer_uid(client) != os.getuid():
                self.refused += 1  # another user: closed before a word is said
                client.close()
                continue
            client.setblocking(True)
            conn = Connection(client.detach())
            try:
                dispatcher = connection(conn)
            except Exception:  # noqa: BLE001 - one client's greeting never ends the harness
                traceback.print_exc()
                conn.close()
                continue
            with lock:
                key = id(dispatcher)
                clients.add(key)
                last[0] = time.monotonic()
            threading.Thread(target=run, args=(key, dispatcher, conn), name="harness-client", daemon=True).start()

    def _still_ours(self) -> bool:
        try:
            return os.lstat(self.path).st_ino == self.inode
        except OSError:
            return False

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            if self._still_ours():
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
