"""A warm harness that outlives one command (the default of `kernelagent eval`, `profile`,
`verify`, `regenerate`, `mcp` and `bench`, one per device; `--no-daemon` or KERNELAGENT_DAEMON=0
turns it off, `bench --ray` never uses it; `Evaluator(daemon=True)`, `EvaluatorPool(daemon=True)`
or KERNELAGENT_DAEMON=1 for the library, see `wanted`): the
harness server started once, listening on a Unix socket of its user's (server/listen.py), and
found again by the next command with the same settings.

The prior art is Gradle's daemon, Bazel's server and mypy's dmypy. A second `kernelagent eval`
then skips the server's start (importing torch and torch._dynamo, the device probe: 8-9 s on an
H100 host) and finds the reference-side compile caches warm.

- **Where.** `$KERNELAGENT_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/kernelagent`, else
  `/tmp/kernelagent-<uid>`: a directory made with mode 0700, and used only while it is a real
  directory (no symlink), owned by this user, that nobody else may enter. Otherwise the command
  runs its own server, and its result says why (`isolation.daemon`).
- **Which.** One socket per settings: the device asked for, the visible devices, the isolation,
  the hidden directories, the CPUs, the jobs at once, the cache root, the interpreter and what
  it imports from (interpreter.identity: this package's folder and version, the installation's
  folders), the server's environment (but the terminal's and this command's scratch), the
  machine's boot and a digest of this package's code. It starts isolated, in its own scratch
  folder (interpreter.module_argv): the folder a command runs in changes nothing it imports. Other settings, or changed code, find
  another socket and start a new harness: a stale one is never used, and ends when idle.
- **Who.** The socket is 0600 in that directory, and the harness closes every connection whose
  peer (SO_PEERCRED) is not its own uid; this side checks the harness's uid the same way.
- **When it goes.** After `idle_timeout` seconds with no connection and no job
  (KERNELAGENT_DAEMON_IDLE_S, default 600), removing its socket and scratch. A socket whose
  harness is gone (killed, a crash) is removed and a new harness started; the result says why
  (`isolation.daemon.why_started`). Its log (`harness-<key>.log` beside the socket) outlives
  it and ends with why it stopped.
- **What it changes.** Nothing in a verdict: each connection is served as a private server
  serves its caller, every job in its own jail; a command that ends or is interrupted takes only
  its own jobs with it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Iterator

from kernelagent.settings import BY_NAME, get as setting

DEFAULT_IDLE_S: float = BY_NAME["KERNELAGENT_DAEMON_IDLE_S"].default
# A socket that refuses us, or a harness that closes on us, is tried once more after a pause
# before it is taken for dead and replaced.
RECONNECT_TRIES, RECONNECT_PAUSE_S = 2, 0.25
LOG_MAX_BYTES = 1 << 20  # a harness's log (beside its socket) is cut back past this when one starts


class DaemonUnavailable(Exception):
    """No warm harness can be used here (the reason is said); the command runs its own server."""


class DaemonStartFailed(RuntimeError):
    """A warm harness was started and never answered (the evaluator says so as HarnessStartError)."""


def wanted(explicit: bool | None, *, cli: bool = False) -> bool:
    """Whether to use the warm harness: `explicit` (`--daemon/--no-daemon`, `Evaluator(daemon=)`)
    where given; else KERNELAGENT_DAEMON where set (1: on, 0: off, for the CLI and the library
    alike); else on for a command of the CLI (`cli`: eval, profile, verify, regenerate, mcp, bench) and
    off for the library, whose embedders (RL trainers, tests) start their own servers."""
    if explicit is not None:
        return bool(explicit)
    chosen = setting("KERNELAGENT_DAEMON")
    return cli if chosen is None else bool(chosen)


def idle_seconds() -> float:
    try:
        return max(1.0, float(setting("KERNELAGENT_DAEMON_IDLE_S")))
    except ValueError:
        return DEFAULT_IDLE_S


def runtime_dir() -> Path:
    """This user's directory for harness sockets, made if missing; DaemonUnavailable unless it
    is a real directory owned by this user that nobody else may enter."""
    from kernelagent.harness import private_dir

    if setting("KERNELAGENT_RUNTIME_DIR") is not None:
        path = setting("KERNELAGENT_RUNTIME_DIR")
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "kernelagent"
    else:
        path = Path("/tmp") / f"kernelagent-{os.getuid()}"
    try:
        return private_dir.make(path, closed=private_dir.ENTER_BY_OTHERS)
    except private_dir.NotPrivate as exc:
        raise DaemonUnavailable(str(exc)) from None


_DIGEST: dict[str, str] = {}


def code_digest() -> str:
    """A digest of this package's files (names, sizes, modification times): changed code starts
    a new harness rather than using one that runs the old."""
    if "d" not in _DIGEST:
        root = Path(__file__).resolve().parents[2]
        h = hashlib.sha256()
        for path in sorted(root.rglob("*.py")):
            try:
                st = path.stat()
            except OSError:
                continue
            h.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        _DIGEST["d"] = h.hexdigest()[:16]
    return _DIGEST["d"]


# Names of the server's environment that change nothing it imports or runs (the terminal's; the
# caller's choice of a warm harness, which no server reads), or that -I ignores (PYTHON*): left out
# of the key, so a wider terminal, or `--daemon` beside KERNELAGENT_DAEMON=0, finds the same harness.
_KEYLESS_ENV = frozenset({"TERM", "COLUMNS", "LINES", "NO_COLOR", "KERNELAGENT_DAEMON"})


def _env_parts(env: dict[str, str] | None, scratch_root: Path | None) -> list[str]:
    """The server environment's part of the key: every name it could read (LD_LIBRARY_PATH, PATH
    for the compilers, CUDA_*, TORCH_*, TRITON_*, ...), but for this command's own scratch
    folder (TMPDIR and the caches under it: the harness found keeps its own)."""
    if env is None:
        return []
    scratch = str(scratch_root) if scratch_root is not None else None
    return [f"{k}={v}" for k, v in sorted(env.items())
            if k not in _KEYLESS_ENV and not k.startswith("PYTHON") and not (scratch and scratch in v)]


def key(settings: list[str], env: dict[str, str] | None = None, scratch_root: Path | None = None) -> str:
    """The socket's name for these settings: they, what the harness's interpreter imports from
    (interpreter.identity: the interpreter, this package's folder and version, the installation's
    folders), its environment (_env_parts), this package's code and the machine's boot."""
    from kernelagent.harness import interpreter

    parts = list(settings) + [sys.executable, code_digest()] + interpreter.identity() + _env_parts(env, scratch_root)
    try:
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    except OSError:
        parts.append("-")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]


def peer_uid(sock: socket.socket) -> int | None:
    from kernelagent.harness.server.listen import peer_uid as uid_of

    return uid_of(sock)


def connect(path: Path, why: list[str] | None = None) -> socket.socket | None:
    """A connection to the harness at `path` if one answers there as this user; None else (and
    why, appended to `why`)."""
    from kernelagent.harness.server.listen import unix_call

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        unix_call(Path(path), sock.connect)
    except OSError as exc:
        sock.close()
        if why is not None:
            why.append(f"no harness answered at the socket ({exc.strerror or exc})")
        return None
    uid = peer_uid(sock)
    if uid != os.getuid():
        sock.close()
        if why is not None:
            why.append(f"the socket's harness runs as uid {uid}, not as this user")
        return None
    return sock


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(str(path), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class Attached:
    """A connection to a warm harness: `conn` (the protocol's), its `hello`, `pid` (the
    harness's), whether this command started it, and its log."""

    def __init__(self, conn: Connection, hello: dict[str, Any], pid: int | None, spawned: bool, socket_path: Path,
                 log: Path | None, why_started: str | None = None):
        self.conn, self.hello, self.pid, self.spawned = conn, hello, pid, spawned
        self.socket_path, self.log, self.why_started = socket_path, log, why_started
        self.reconnected: str | None = None  # what the first try met, where a second one answered


def _greeted(sock: socket.socket, timeout: float, why: list[str] | None = None
             ) -> tuple[Connection, dict[str, Any]] | None:
    """The harness's hello on a fresh connection, or None (it closed: a harness dying, or one
    that refused us; why is appended to `why`)."""
    from kernelagent.harness import protocol

    conn = Connection(sock.detach())
    try:
        if not conn.poll(timeout):
            conn.close()
            if why is not None:
                why.append(f"the socket's harness said nothing within {timeout:.0f} s")
            return None
        hello = protocol.recv(conn, {"hello"}, max_bytes=protocol.MAX_CALLER_FRAME)
    except (EOFError, OSError, protocol.ProtocolError) as exc:
        conn.close()
        if why is not None:
            why.append(f"the socket's harness closed the connection without a hello ({type(exc).__name__})")
        return None
    return conn, hello


def attach(command: list[str], env: dict[str, str], settings: list[str], scratch_root: Path,
           start_timeout: float, idle_s: float | None = None) -> Attached:
    """Connect to this user's harness for `settings`, starting it (`command`: the server's
    command line without --fd, bubblewrap's prefix included; it runs in `scratch_root`, which
    it removes when it ends) when none answers. DaemonUnavailable where none can be used."""
    where = runtime_dir()
    name = key(settings, env, scratch_root)
    path = where / f"harness-{name}.sock"
    with _locked(where / f"harness-{name}.lock"):
        why: list[str] = []
        log = where / f"harness-{name}.log"
        for attempt in range(RECONNECT_TRIES if os.path.lexists(path) else 0):
            if attempt:
                time.sleep(RECONNECT_PAUSE_S)  # a passing refusal (a loaded host) is not a dead harness
            sock = connect(path, why)
            greeted = _greeted(sock, start_timeout, why) if sock is not None else None
            if greeted is not None:
                conn, hello = greeted
                attached = Attached(conn, hello, None, False, path, log)
                attached.reconnected = why[0] if why else None
                return attached
            if why and why[-1].startswith("the socket's harness said nothing"):
                break  # silent for the whole start timeout already: not a passing refusal
        why_started = why[0] if why else "no harness of these settings was listening (no socket)"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a harness that died (or is dying): its socket goes, a new one starts
        # Its log outlives it (its scratch goes with it): the last lines say why it ended. Appended
        # to (a harness taken for dead may still write), and cut back once it passes LOG_MAX_BYTES.
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with open(fd, "ab") as out:
            if os.fstat(fd).st_size > LOG_MAX_BYTES:
                os.ftruncate(fd, 0)
            out.write(f"== {time.strftime('%Y-%m-%d %H:%M:%S')} harness started: {why_started}\n".encode())
            out.flush()
            proc = subprocess.Popen(command + ["--listen", str(path), "--idle-timeout", str(idle_s or idle_seconds()),
                                               "--owns-scratch"],
                                    env=env, cwd=scratch_root,  # its own folder, never the user's
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        until = time.monotonic() + start_timeout
        while time.monotonic() < until:
            sock = connect(path)
            if sock is not None:
                greeted = _greeted(sock, max(1.0, until - time.monotonic()))
                if greeted is not None:
                    return Attached(greeted[0], greeted[1], proc.pid, True, path, log, why_started)
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, 9)
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise DaemonStartFailed(f"the warm harness did not start within {start_timeout:.0f} s:\n{tail}")


def describe(hello: dict[str, Any], attached: Attached) -> dict[str, Any]:
    info = dict(hello.get("daemon") or {}) if isinstance(hello.get("daemon"), dict) else {}
    described = {"socket": str(attached.socket_path), "pid": info.get("pid"), "started_now": attached.spawned,
                 "idle_timeout_s": info.get("idle_timeout_s"), "log": str(attached.log) if attached.log else None}
    if attached.spawned and attached.why_started:  # why no harness of these settings served it
        described["why_started"] = attached.why_started
    if attached.reconnected:
        described["reconnected_after"] = attached.reconnected
    return described
