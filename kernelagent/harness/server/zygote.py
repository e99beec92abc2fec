"""A process that has imported torch and forks harness servers on request
(interpreter.module_argv("kernelagent.harness.server.zygote", "--socket", PATH): isolated, as
every trusted interpreter; caller/zygote.py asks it).

Why: a harness server's start is mostly `import torch` (1.4 CPU-s of its 1.9 on the CI machine),
and the test suite starts hundreds of servers, each for a test's own settings (its cache root,
its isolation), so a warm harness (caller/daemon.py) cannot be shared between them. A server
forked from here starts with torch already imported and is otherwise a fresh process: its own
session, working directory, environment, argv, stdio and channel, `kernelagent` imported anew
(module state set at import follows its own environment), Python's `random` reseeded.

Used where KERNELAGENT_SERVER_ZYGOTE names its socket (tests/conftest.py starts one per pytest
worker), for servers that run on the host itself: never under bubblewrap's prefix, never for a
warm harness. What torch reads at import (OMP_NUM_THREADS) is the zygote's, and so is Triton's
TRITON_INTERPRET where the zygote imports Triton too (given TRITON_INTERPRET=1: a machine
without a GPU, where every server sets it): start it with the environment its servers get
(sandbox.server_environ: no secret sits in its /proc/PID/environ, which a forked server shows as
its own).

The protocol: one request per connection, a JSON object (no pickle) with the channel and the
log as SCM_RIGHTS descriptors; the reply a JSON line {"pid": N}, then {"exit": code} when that
server ends. Only a peer of this process's own uid is served.
"""

from __future__ import annotations

import argparse
import array
import json
import os
import select
import signal
import socket
import sys
from pathlib import Path

from kernelagent.harness.server.listen import peer_uid

MODULE = "kernelagent.harness.server"
MAX_REQUEST = 1 << 20
MAX_ARGS = 512
MAX_FD = 1 << 16


class BadRequest(ValueError):
    pass


def parse_request(data: bytes) -> tuple[str, list[str], dict[str, str], str]:
    """The interpreter, argv (after `-m MODULE`), environment and working directory of a
    request, checked."""
    try:
        req = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(f"not JSON: {exc}") from None
    if not isinstance(req, dict) or set(req) != {"executable", "argv", "env", "cwd"}:
        raise BadRequest("expected exactly executable, argv, env and cwd")
    executable, argv, env, cwd = req["executable"], req["argv"], req["env"], req["cwd"]
    if not (isinstance(executable, str) and same_interpreter(executable)):
        raise BadRequest(f"executable: not this zygote's interpreter ({sys.executable})")
    if not (isinstance(argv, list) and len(argv) <= MAX_ARGS and all(isinstance(a, str) and "\0" not in a for a in argv)):
        raise BadRequest("argv: a list of strings")
    if "--fd" not in argv[:-1]:
        raise BadRequest("argv: --fd is required (the channel comes as a descriptor)")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) and k and "=" not in k
                                          and "\0" not in k + v for k, v in env.items())):
        raise BadRequest("env: a mapping of strings")
    if not (isinstance(cwd, str) and os.path.isabs(cwd) and "\0" not in cwd):
        raise BadRequest("cwd: an absolute path")
    return executable, argv, env, cwd


def same_interpreter(executable: str) -> bool:
    """`executable` is the interpreter this process runs, by another name at most (a venv's
    python and python3): the same binary in the same folder, so the same environment's packages."""
    if "\0" in executable or not os.path.isabs(executable):
        return False
    mine = sys.executable
    return (os.path.dirname(executable) == os.path.dirname(mine)
            and os.path.realpath(executable) == os.path.realpath(mine))


def _recv_request(conn: socket.socket) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    data, ancdata, flags, _ = conn.recvmsg(MAX_REQUEST, socket.CMSG_SPACE(2 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        raise BadRequest("expected one message and two descriptors (the channel, the log)")
    return data, list(fds)


def _become_server(executable: str, argv: list[str], env: dict[str, str], cwd: str, chan: int, log: int) -> None:
    """In the forked child: a fresh server process but for the imports already made. Never returns."""
    code = 1
    try:
        os.setsid()
        # The dispositions a fresh interpreter starts with: SIGTERM as the zygote had it before it
        # set its own handler; SIGPIPE and SIGXFSZ stay ignored and SIGINT raises KeyboardInterrupt
        # (Python's own start; with SIGPIPE at its default, a write to a channel the candidate
        # closed killed the server instead of raising BrokenPipeError).
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, chan)  # nothing of the zygote's (its socket, other requests) stays open
        os.closerange(chan + 1, MAX_FD)
        os.set_inheritable(chan, True)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        import random
        import tempfile

        random.seed()  # a fresh process's state, not the zygote's (the same in every server)
        tempfile.tempdir = None  # TMPDIR is the server's scratch root, read anew
        for name in [m for m in sys.modules if m == "kernelagent" or m.startswith("kernelagent.")]:
            del sys.modules[name]  # imported anew under the server's own environment
        argv = list(argv)
        argv[argv.index("--fd") + 1] = str(chan)
        sys.argv = [MODULE] + argv
        sys.executable = executable  # the name the caller started it by (the device probe's key has it)
        # sys.path stays the zygote's own: it starts isolated (interpreter.module_argv), so no
        # working directory is on it, and the server checks it again as it starts.
        threads = env.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            import torch

            torch.set_num_threads(int(threads))  # the zygote's OpenMP read its own at import
        import runpy

        runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the server's log says why
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _send(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass  # the caller went away; its server ends with its channel


def serve(path: Path) -> None:
    import torch  # noqa: F401 - the point of this process

    if os.environ.get("TRITON_INTERPRET") == "1":
        # Started for a machine without a GPU (tests/server_zygote.py): its servers all set
        # TRITON_INTERPRET=1 before they import Triton (server/main.py), which reads it at import.
        import triton  # noqa: F401

    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    print(json.dumps({"ready": os.getpid()}), flush=True)
    while os.getppid() == parent:
        readable, _, _ = select.select([listener], [], [], 0.2)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
                conn.close()
        if not readable:
            continue
        conn, _ = listener.accept()
        if peer_uid(conn) != os.getuid():
            conn.close()
            continue
        conn.settimeout(10)
        try:
            data, (chan, log) = _recv_request(conn)
            executable, argv, env, cwd = parse_request(data)
        except (BadRequest, OSError) as exc:
            _send(conn, {"error": str(exc)[:300]})
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            _become_server(executable, argv, env, cwd, chan, log)
        os.close(chan)
        os.close(log)
        children[pid] = conn
        _send(conn, {"pid": pid})
    for pid in children:  # the test session that started us is gone: so are its servers' callers
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="forks harness servers with torch imported (tests)")
    parser.add_argument("--socket", required=True, help="the Unix socket to listen on (its folder: 0700)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve(Path(args.socket))
    finally:
        try:
            os.unlink(args.socket)
        except OSError:
            pass


if __name__ == "__main__":
    main()
