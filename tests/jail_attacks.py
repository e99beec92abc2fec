"""Attacks on the per-job jail (kernelagent/harness/jail/namespaces.py), run by tests/test_jail.py.

This script plays the harness server: it forks one job per attack, the job enters the jail
first thing and then attacks, and reports what happened through a pipe; what must be checked
from outside (the daemon died, nothing leaked into /dev/shm, a file outside is unchanged) is
checked here, in the "server", after the job ended. Run as

    python tests/jail_attacks.py caller --layer direct|bwrap|nobody [--mode namespaces|none]

"caller" is the trusted side: it has a canary secret in its environment (as `kernelagent eval`
has API keys) and starts the "server" with a scrubbed environment, under bubblewrap for
--layer bwrap, as uid 65534 for --layer nobody. The server prints one JSON object: attack name
-> {"child": what the job saw, "parent": what the server saw, "status": exit code, "jail": the
jail's description}.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kernelagent.harness.jail import mounts  # noqa: E402
from kernelagent.harness.jail import namespaces as jail  # noqa: E402

CANARY_NAME = "KA_TEST_CANARY"  # not a "secret" name: the scrubber would not remove it, we do


def err(fn) -> str:
    """Run fn; "ok" or the errno name it failed with."""
    try:
        fn()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno else type(exc).__name__
    except mounts.JailError as exc:
        return errno.errorcode.get(getattr(exc, "errno", 0), "JailError")


def write_file(path, text="pwned", **kw):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644, **kw)
    os.write(fd, text.encode())
    os.close(fd)


# -- the attacks: each runs inside the job, after enter_job_jail ---------------------------------

def a_processes(ctx):
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    return {"pids": pids, "me": os.getpid(), "ppid": os.getppid(),
            "kill_server": err(lambda: os.kill(ctx["server_pid"], 0)),
            "caller_proc": os.path.exists(f"/proc/{ctx['caller_pid']}/environ") and ctx["caller_pid"] != 1}


def a_writes(ctx):
    victim = ctx["victim"]
    root_fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    outside_fd = os.open(ctx["outside"], os.O_RDONLY | os.O_DIRECTORY)
    os.symlink(victim, "link-to-victim")
    out = {
        "etc": err(lambda: write_file("/etc/kernelagent-jail-test")),
        "victim": err(lambda: write_file(victim)),
        "victim_truncate": err(lambda: os.truncate(victim, 0)),
        "outside_new": err(lambda: write_file(os.path.join(ctx["outside"], "new"))),
        "dir_fd_root": err(lambda: write_file(os.path.relpath(victim, "/"), dir_fd=root_fd)),
        "dir_fd_outside": err(lambda: write_file("new", dir_fd=outside_fd)),
        "proc_self_root": err(lambda: write_file("/proc/self/root" + victim)),
        "proc_1_root": err(lambda: write_file("/proc/1/root" + victim)),
        "symlink": err(lambda: write_file("link-to-victim")),
        "mkdir": err(lambda: os.mkdir(os.path.join(ctx["outside"], "d"))),
        "rename": err(lambda: os.rename(victim, victim + ".moved")),
        "unlink": err(lambda: os.unlink(victim)),
        "chmod": err(lambda: os.chmod(victim, 0o777)),
        "tmp": err(lambda: write_file("/tmp/kernelagent-jail-test")),
        "dev_null": err(lambda: write_file("/dev/null")),
        "scratch": err(lambda: write_file(os.path.join(ctx["scratch"], "mine.txt"))),
        "scratch_relative": err(lambda: write_file("mine2.txt")),
        "cwd": os.getcwd(),
    }
    return out


def p_writes(ctx, child):
    return {"victim": Path(ctx["victim"]).read_text(), "outside": sorted(os.listdir(ctx["outside"])),
            "etc": os.path.exists("/etc/kernelagent-jail-test"), "tmp": os.path.exists("/tmp/kernelagent-jail-test"),
            "scratch": sorted(os.listdir(ctx["scratch"]))}


def a_hidden(ctx):
    secret = os.path.join(ctx["hidden"], "secret.txt")
    def read(path):
        with open(path) as fh:
            return fh.read()
    return {
        "listdir": sorted(os.listdir(ctx["hidden"])),
        "read": err(lambda: read(secret)),
        "proc_self_root": err(lambda: read("/proc/self/root" + secret)),
        "other_job": err(lambda: read(os.path.join(ctx["other_job"], "candidate.py"))),
        "scratch_root_listing": sorted(os.listdir(os.path.dirname(ctx["scratch"]))),
        "write_hidden": err(lambda: write_file(os.path.join(ctx["hidden"], "x"))),
    }


def a_mounts(ctx):
    libc = mounts.libc
    def mnt(src, tgt, fstype, flags):
        mounts.mount(src, tgt, fstype, flags)
    os.mkdir("m")
    return {
        "tmpfs": err(lambda: mnt("tmpfs", "m", "tmpfs", 0)),
        "remount_root_rw": err(lambda: mnt(None, "/", None, mounts.MS_REMOUNT | mounts.MS_BIND)),
        "setattr_root_rw": err(lambda: mounts.mount_setattr("/", 0, mounts.MOUNT_ATTR_RDONLY, True)),
        "bind_hidden": err(lambda: mnt(ctx["hidden"], "m", None, mounts.MS_BIND)),
        "umount_hide": err(lambda: mounts.check_errno(libc.umount2(mounts._b(ctx["hidden"]), 2), "umount2")),
        "umount_proc": err(lambda: mounts.check_errno(libc.umount2(b"/proc", 2), "umount2")),
        "unshare_user": err(lambda: jail.unshare(jail.CLONE_NEWUSER)),
        "unshare_mount": err(lambda: jail.unshare(jail.CLONE_NEWNS)),
        "chroot": err(lambda: os.chroot(".")),
    }


def a_network(ctx):
    def tcp(addr):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(addr)
        finally:
            s.close()
    def udp(addr):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.sendto(b"x", addr)
        finally:
            s.close()
    def abstract():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(ctx["abstract"])
        finally:
            s.close()
    ifaces = sorted(name for _, name in socket.if_nameindex())
    return {"loopback": err(lambda: tcp(("127.0.0.1", ctx["port"]))),
            # TEST-NET-1: never routed; from inside the namespace nothing leaves the host anyway
            "external": err(lambda: tcp(("192.0.2.1", 80))),
            "udp_external": err(lambda: udp(("192.0.2.1", 53))),
            "abstract_unix": err(abstract), "interfaces": ifaces}


def a_shm(ctx):
    before = sorted(os.listdir("/dev/shm"))
    write_file("/dev/shm/kernelagent-jail-leak", "x" * 1000)
    # A POSIX shared memory segment too (shm_open, as multiprocessing.shared_memory does; not
    # that class itself, whose resource-tracker process is beside the point here).
    import _posixshmem

    fd = _posixshmem.shm_open("/kernelagent-jail-seg", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
    os.close(fd)
    return {"before": before, "after": sorted(os.listdir("/dev/shm"))}


def p_shm(ctx, child):
    return {"leak": os.path.exists("/dev/shm/kernelagent-jail-leak"),
            "seg": os.path.exists("/dev/shm/kernelagent-jail-seg"),
            "marker_still_there": os.path.exists(ctx["shm_marker"])}


def a_daemon(ctx):
    """A double-forked setsid daemon holding the canary pipe; it must die with the job."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork():
            os._exit(0)
        # Keep only the canary pipe: the result pipe would keep the server waiting (mode none).
        os.closerange(3, ctx["canary_w"])
        os.closerange(ctx["canary_w"] + 1, 1 << 16)
        ctypes.CDLL(None).prctl(15, ctx["daemon_name"].encode(), 0, 0, 0)  # PR_SET_NAME
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        time.sleep(600)
        os._exit(0)
    os.waitpid(pid, 0)
    os.close(ctx["canary_w"])  # only the daemon holds it now
    time.sleep(0.05)
    return {"daemon_forked": True}


def _pipe_eof_within(fd, seconds):
    import select
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            if os.read(fd, 1) == b"":
                return True
    return False


def _comm_alive(name):
    """The pid of a live process of this name. A zombie is dead: it closed its files (the
    canary pipe's EOF) and only waits to be reaped, which may come a moment later (it was a
    flake: the test read /proc between the two)."""
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if Path(f"/proc/{p}/comm").read_text().strip() != name:
                    continue
                state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    return int(p)
            except (OSError, IndexError):
                pass
    return None


def _comm_gone_within(name, seconds):
    """None once no live process has this name, else the pid still alive after `seconds`.
    The canary pipe reads EOF when the daemon's files close, which is early in its exit, a
    moment before the kernel marks it a zombie: one read of /proc right after the EOF could
    see it still running (CI flaked so). Killed means gone within a bounded time."""
    deadline = time.monotonic() + seconds
    while (pid := _comm_alive(name)) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    return pid


def p_daemon(ctx, child):
    dead = _pipe_eof_within(ctx["canary_r"], 5.0)
    pid = _comm_gone_within(ctx["daemon_name"], 2.0)
    if pid:  # never leave it behind (it survives in mode "none")
        os.kill(pid, signal.SIGKILL)
    return {"canary_pipe_eof": dead, "daemon_alive_by_comm": pid is not None}


def a_fds(ctx):
    fd = ctx["pair_fd"]
    open_fds = sorted(int(n) for n in os.listdir("/proc/self/fd"))
    def use():
        s = socket.socket(fileno=os.dup(fd))
        s.send(b"pwned")
    return {"fstat": err(lambda: os.fstat(fd)), "send": err(use), "open_fds": open_fds}


def p_fds(ctx, child):
    ctx["pair_peer"].setblocking(False)
    try:
        got = ctx["pair_peer"].recv(100)
    except BlockingIOError:
        got = b""
    return {"received": got.decode()}


def a_secrets(ctx):
    canary = ctx["canary"]
    found = []
    readable = 0
    for p in os.listdir("/proc"):
        if not p.isdigit() and p != "self":
            continue
        for name in ("environ", "cmdline"):
            try:
                data = Path(f"/proc/{p}/{name}").read_bytes()
                readable += 1
            except OSError:
                continue
            if canary.encode() in data:
                found.append(f"/proc/{p}/{name}")
    return {"found": found, "readable": readable, "in_os_environ": canary in "".join(os.environ.values()),
            "caller_environ": err(lambda: Path(f"/proc/{ctx['caller_pid']}/environ").read_bytes())}


def a_caps(ctx):
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {k: status[k].strip() for k in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb", "NoNewPrivs")} | {
        "uid": os.getuid(), "setuid0": err(lambda: os.setuid(0)), "setgroups": err(lambda: os.setgroups([]))}


def a_nproc(ctx):
    pids, failed = [], 0
    for _ in range(40):
        try:
            pid = os.fork()
        except OSError:
            failed += 1
            continue
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        pids.append(pid)
    return {"forked": len(pids), "refused": failed}


def a_exit(ctx):
    os._exit(7)


def a_segv(ctx):
    import faulthandler
    faulthandler.disable()
    ctypes.string_at(0)


def a_hang(ctx):
    a_daemon(ctx)
    os.write(ctx["ready_w"], b"r")
    time.sleep(600)


ATTACKS = {
    "processes": (a_processes, None, {}),
    "writes": (a_writes, p_writes, {}),
    "writes_remount_fallback": (a_writes, p_writes, {"force_fallback": True}),
    "hidden": (a_hidden, None, {}),
    "mounts": (a_mounts, None, {}),
    "network": (a_network, None, {}),
    "shm": (a_shm, p_shm, {}),
    "daemon": (a_daemon, p_daemon, {"canary": True}),
    "fds": (a_fds, p_fds, {}),
    "secrets": (a_secrets, None, {}),
    "caps": (a_caps, None, {}),
    "nproc": (a_nproc, None, {"limits": {"nproc": 16}}),
    "nproc_run_as": (a_nproc, None, {"limits": {"nproc": 16}, "run_as": (65534, 65534)}),
    "exit_status": (a_exit, None, {}),
    "segv_status": (a_segv, None, {}),
    "kill_waiter": (a_hang, p_daemon, {"canary": True, "kill_waiter": True}),
}


def run_attack(name: str, base: Path, mode: str, caller_pid: int, canary: str) -> dict:
    child_fn, parent_fn, opts = ATTACKS[name]
    scratch_root = base / "scratch-root"
    scratch = scratch_root / f"job-{name}"
    other_job = scratch_root / "job-other"
    hidden = base / "hidden"
    outside = base / "outside"
    for d in (scratch, other_job, hidden, outside):
        d.mkdir(parents=True, exist_ok=True)
    (other_job / "candidate.py").write_text("other job's code")
    (hidden / "secret.txt").write_text("secret")
    victim = outside / "victim.txt"
    victim.write_text("original")
    ctx = {"scratch": str(scratch), "hidden": str(hidden), "outside": str(outside), "victim": str(victim),
           "other_job": str(other_job), "caller_pid": caller_pid, "server_pid": os.getpid(), "canary": canary}

    keep = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    ctx["port"] = listener.getsockname()[1]
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ctx["abstract"] = f"\0kernelagent-jail-test-{os.getpid()}-{name}"
    abstract.bind(ctx["abstract"])
    abstract.listen(1)
    pair_job, pair_peer = socket.socketpair()
    ctx["pair_fd"], ctx["pair_peer"] = pair_job.fileno(), pair_peer
    ctx["shm_marker"] = f"/dev/shm/kernelagent-jail-marker-{os.getpid()}"
    Path(ctx["shm_marker"]).write_text("server's")
    if opts.get("canary"):
        ctx["canary_r"], ctx["canary_w"] = os.pipe()
        ctx["daemon_name"] = f"kajd{os.getpid() % 100000}{name[:3]}"
        keep.append(ctx["canary_w"])
    ready_r, ctx["ready_w"] = os.pipe()
    keep.append(ctx["ready_w"])
    result_r, result_w = os.pipe()
    keep.append(result_w)
    log = scratch / "job.log"
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            # The caller owns the redirection: fds 1 and 2 point at the job's log before the jail.
            logfd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(logfd, 1)
            os.dup2(logfd, 2)
            os.close(logfd)
            mounts.FORCE_REMOUNT_FALLBACK = bool(opts.get("force_fallback"))
            desc = jail.enter_job_jail(scratch, [hidden, scratch_root], keep, mode, limits=opts.get("limits"),
                                       run_as=opts.get("run_as"))
            desc["ready_s"] = time.perf_counter() - started
            os.write(result_w, (json.dumps({"jail": desc}) + "\n").encode())
            out = child_fn(ctx)
            os.write(result_w, (json.dumps({"child": out}) + "\n").encode())
        except BaseException as exc:  # noqa: BLE001 - reported to the server
            os.write(result_w, (json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n").encode())
        os._exit(0)
    os.close(result_w)
    os.close(ctx["ready_w"])
    if opts.get("canary"):
        os.close(ctx["canary_w"])
    pair_job.close()
    report: dict = {}
    if opts.get("kill_waiter"):
        os.read(ready_r, 1)  # the job is in the jail, its daemon started
        os.kill(pid, signal.SIGKILL)  # what the server's timeout does to the job's process
    data = b""
    while chunk := os.read(result_r, 65536):
        data += chunk
    _, status = os.waitpid(pid, 0)
    report["status"] = os.waitstatus_to_exitcode(status)
    for line in data.decode().splitlines():
        report.update(json.loads(line))
    if parent_fn:
        report["parent"] = parent_fn(ctx, report.get("child"))
    os.unlink(ctx["shm_marker"])  # (left behind only if this server is killed mid-run)
    for s in (listener, abstract, pair_peer):
        s.close()
    return report


def server_main(args) -> None:
    base = Path(args.base)
    out = {}
    for name in args.attacks or list(ATTACKS):
        (base / name).mkdir(exist_ok=True)
        out[name] = run_attack(name, base / name, args.mode, args.caller_pid, args.canary)
    print(json.dumps(out))


def caller_main(args) -> None:
    """The trusted caller: the canary lives in its (exec-time) environment; the server gets a
    scrubbed one."""
    assert os.environ.get(CANARY_NAME), "run the caller with the canary in its environment"
    canary = os.environ[CANARY_NAME]
    base = Path(tempfile.mkdtemp(prefix="kernelagent-jail-test-"))
    os.chmod(base, 0o755)  # run_as (uid 65534) must reach its scratch directory
    env = {k: v for k, v in os.environ.items() if k != CANARY_NAME}
    env["PYTHONPATH"] = str(REPO)
    # The canary reaches the server only through this argument (so the server can look for it);
    # the server scrubs it from its own command line before any job exists (see server_main).
    cmd = [sys.executable, str(Path(__file__).resolve()), "server", "--base", str(base), "--mode", args.mode,
           "--caller-pid", str(os.getpid()), "--canary-fd", "0"]
    for a in args.attacks or []:
        cmd += ["--attack", a]
    prefix: list[str] = []
    if args.layer == "bwrap":
        from kernelagent.harness.jail.sandbox import bubblewrap_prefix

        p = bubblewrap_prefix(base, probe_jail=False)
        if p is None:
            print(json.dumps({"skip": "bubblewrap unavailable"}))
            return
        prefix = p.argv
    elif args.layer == "nobody":
        os.chmod(base, 0o777)
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    try:
        done = subprocess.run(prefix + cmd, input=canary.encode(), capture_output=True, env=env, timeout=120)
        if done.returncode != 0:
            print(json.dumps({"error": done.stderr.decode(errors="replace")[-3000:]}))
        else:
            sys.stdout.write(done.stdout.decode())
    finally:
        subprocess.run(["rm", "-rf", str(base)])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["caller", "server"])
    ap.add_argument("--layer", default="direct", choices=["direct", "bwrap", "nobody"])
    ap.add_argument("--mode", default="namespaces")
    ap.add_argument("--base")
    ap.add_argument("--caller-pid", type=int, default=0)
    ap.add_argument("--canary-fd", type=int)
    ap.add_argument("--attack", dest="attacks", action="append")
    args = ap.parse_args()
    if args.role == "caller":
        caller_main(args)
    else:
        args.canary = os.read(args.canary_fd, 4096).decode()  # from stdin: not in argv, not in environ
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        server_main(args)


if __name__ == "__main__":
    main()
