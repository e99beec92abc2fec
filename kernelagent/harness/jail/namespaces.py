"""Per-job kernel namespaces, entered in a process forked from the harness server.

Why a fork and not a fresh `bwrap`/`unshare` exec per job: the server has torch (and Triton)
imported already; a forked child keeps them, a fresh interpreter pays seconds of imports.
unshare(CLONE_NEWUSER) refuses a multi-threaded caller, and a forked child has exactly one
thread (the one that forked), so the jail is entered right after fork and before any
candidate code exists.

The layout of one job after `enter_job_jail(..., mode="namespaces")`:

    server ── fork ──> J (the caller's job process; outside the job's pid namespace)
                        │  closes inherited fds, unshare(user|mnt|pid|net|ipc|uts), maps its ids
                        └─ fork ──> pid 1 of the new pid namespace: mounts, limits, drops every
                                    capability, then RETURNS to the caller's code (the job)
    J only waits for pid 1 and exits with the same status. When pid 1 ends, the kernel kills
    every other process of the namespace (setsid daemons included); when J dies, pid 1 gets
    SIGKILL (PR_SET_PDEATHSIG), so killing J or its process group ends the whole job.

What holds inside (checked by tests/test_jail.py):
- pid: the job sees only its own processes; /proc is a fresh mount for its pid namespace.
- mount: every mount is read-only (recursively); the `hide` paths are empty read-only tmpfs;
  only `scratch` is writable; /dev/shm is a private, size-limited tmpfs.
- net: a namespace with only a loopback interface that is down: no connection anywhere.
- ipc, uts: private (SysV IPC and POSIX message queues, hostname).
- user: the job runs with zero capabilities, an empty bounding set and no_new_privs, also
  when the server runs as root; it cannot create further namespaces (the per-namespace
  limits are set to 0), so it cannot regain capabilities in a nested user namespace either.
- limits: RLIMIT_NOFILE, RLIMIT_FSIZE, RLIMIT_CORE=0, RLIMIT_NPROC (see `_set_limits`).
"""

from __future__ import annotations

import ctypes
import os
import resource
import select
import signal
import time
from pathlib import Path
from typing import Any

from kernelagent.harness.jail.fds import close_inherited_fds
from kernelagent.harness.jail.mounts import (
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_REC,
    JailError,
    check_errno,
    is_under,
    libc,
    mount,
    set_readonly,
    hide_all,
    seal,
)

# -- kernel constants (linux/sched.h, linux/mount.h, linux/prctl.h, linux/securebits.h) ------
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
JOB_NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS

PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
# NOROOT(+LOCKED): uid 0 gains nothing at execve; NO_SETUID_FIXUP(+LOCKED); KEEP_CAPS_LOCKED;
# NO_CAP_AMBIENT_RAISE(+LOCKED). All locked, so the job cannot undo them.
SECUREBITS_ALL_LOCKED = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80
LINUX_CAPABILITY_VERSION_3 = 0x20080522

# The per-user-namespace limits on creating namespaces (/proc/sys/user/max_*_namespaces).
NESTED_NAMESPACE_LIMITS = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup", "time")

DEFAULT_LIMITS = {
    # Open files: bounds what a job can pin in the kernel; torch and Triton stay far below.
    "nofile": 4096,
    # Largest single file the job may write (scratch bytes, per file: the kernel has no
    # per-directory byte limit without quotas; a tmpfs scratch would be the hard total).
    "fsize": 4 << 30,
    # Tasks (processes AND threads) of the job. RLIMIT_NPROC counts per (user namespace, uid)
    # since Linux 5.14, and each job has a user namespace of its own, so this counts the
    # job's own tasks only, not the server's or other jobs' (tests/test_jail.py checks it).
    # Generous because torch starts one OpenMP thread per core and CUDA a few more.
    "nproc": 1024,
}



class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]




def _prctl(option: int, arg2: int = 0, what: str = "prctl") -> None:
    check_errno(libc.prctl(option, arg2, 0, 0, 0), what)


def unshare(flags: int) -> None:
    if hasattr(os, "unshare"):  # Python >= 3.12
        try:
            os.unshare(flags)
        except OSError as exc:
            raise JailError(f"unshare({flags:#x}): {exc.strerror}") from None
    else:
        check_errno(libc.unshare(flags), f"unshare({flags:#x})")


def write_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)



def _loopback_up() -> None:
    """`ip link set lo up` in the current network namespace (SIOCSIFFLAGS on "lo")."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock.fileno(), siocgifflags, request))[1]
        fcntl.ioctl(sock.fileno(), siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))


# -- capabilities and limits --------------------------------------------------------------------

class _IdMapper:
    """A helper forked before unshare, so it stays in the parent user namespace with root's
    capabilities there, and writes our uid_map and gid_map once we have unshared."""

    def __init__(self) -> None:
        self._go_r, self._go_w = os.pipe()
        self._done_r, self._done_w = os.pipe()
        target = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self._go_w)
            os.close(self._done_r)
            try:
                maps = b""
                while chunk := os.read(self._go_r, 4096):
                    maps += chunk
                uid_map, gid_map = maps.decode().split("|", 1)
                write_file(f"/proc/{target}/uid_map", uid_map)
                write_file(f"/proc/{target}/gid_map", gid_map)
                os.write(self._done_w, b"ok")
            except BaseException as exc:  # noqa: BLE001 - said to the jail, which raises it
                os.write(self._done_w, f"{type(exc).__name__}: {exc}".encode()[:400])
            os._exit(0)
        os.close(self._go_r)
        os.close(self._done_w)

    def write(self, uid_map: str, gid_map: str) -> None:
        os.write(self._go_w, f"{uid_map}|{gid_map}".encode())
        os.close(self._go_w)
        answer = os.read(self._done_r, 512)
        os.close(self._done_r)
        os.waitpid(self.pid, 0)
        if answer != b"ok":
            raise JailError(f"mapping the job's uid: {answer.decode(errors='replace') or 'the helper died'}")


def _drop_bounding_set() -> None:
    """Empty the bounding set and the ambient set (needs CAP_SETPCAP: before capset or a uid change)."""
    last_cap = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last_cap + 1):
        _prctl(PR_CAPBSET_DROP, cap, f"prctl(PR_CAPBSET_DROP, {cap})")
    check_errno(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")


def _become(run_as: tuple[int, int]) -> None:
    """Switch every id to the job's (mapped to itself by our user namespace). The kernel clears
    the permitted and effective capabilities when no uid is 0 any more (no securebit is set yet
    to stop that); the bounding set must go first, while CAP_SETPCAP is still held."""
    _drop_bounding_set()
    uid, gid = run_as
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def drop_capabilities(keep_setuid_fixup: bool = False) -> None:
    """No capability left, none to regain: locked securebits (uid 0 gains nothing through
    execve), an empty bounding set, no ambient set, capset to zero, then no_new_privs. The
    order matters: the bounding set and securebits need CAP_SETPCAP, so capset comes last.
    After _become (keep_setuid_fixup) CAP_SETPCAP is gone: the bounding set is already empty and
    the securebits cannot be set (with no uid 0 left and no_new_privs, they guard nothing)."""
    if not keep_setuid_fixup:
        _prctl(PR_SET_SECUREBITS, SECUREBITS_ALL_LOCKED, "prctl(PR_SET_SECUREBITS)")
        _drop_bounding_set()
    else:  # the bounding set went in _become; the ambient set is cleared again, as before
        check_errno(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")
    header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()  # all zero: effective, permitted, inheritable
    check_errno(libc.capset(ctypes.byref(header), data), "capset(0)")
    _prctl(PR_SET_NO_NEW_PRIVS, 1, "prctl(PR_SET_NO_NEW_PRIVS)")


def _set_limits(limits: dict[str, int]) -> dict[str, int]:
    """Hard and soft limits both, so the job cannot raise them back.

    Not limited on purpose: RLIMIT_AS/RLIMIT_DATA (CUDA reserves terabytes of virtual address
    space; host RAM needs a cgroup, which a job cannot get here without a delegated cgroup
    tree) and RLIMIT_MEMLOCK (pinned host memory for CUDA)."""
    names = {"nofile": resource.RLIMIT_NOFILE, "fsize": resource.RLIMIT_FSIZE, "nproc": resource.RLIMIT_NPROC,
             "core": resource.RLIMIT_CORE}
    applied = {}
    for name, value in {**limits, "core": 0}.items():
        if value is None:
            continue
        _, hard = resource.getrlimit(names[name])
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(names[name], (value, value))
        applied[name] = value
    return applied


def _outer_uid_is_root(euid: int) -> bool:
    """Does our uid map to uid 0 one namespace up (or are we root in the initial namespace)?
    Inside a root-started bwrap with --uid 1000, uid 1000 is still root outside, and the kernel
    exempts that uid from RLIMIT_NPROC."""
    try:
        for line in Path("/proc/self/uid_map").read_text().splitlines():
            inside, outside, count = (int(x) for x in line.split())
            if inside <= euid < inside + count:
                return outside + (euid - inside) == 0
    except (OSError, ValueError):
        pass
    return euid == 0


# -- the jail -------------------------------------------------------------------------------------

def _chown_tree(root: Path, uid: int, gid: int) -> None:
    """Hand the job's scratch (and what the server put in it) to the job's uid. Links are
    changed, never followed, and other file systems are not entered."""
    device = os.lstat(root).st_dev
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.lstat(path).st_dev == device:
                os.lchown(path, uid, gid)
        dirnames[:] = [d for d in dirnames if os.lstat(os.path.join(dirpath, d)).st_dev == device]


def _forward_status(status: int) -> None:
    """Exit the way the waited-for process did: same exit code, or death by the same signal."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), -code)
        os._exit(128 - code)
    os._exit(code)


def _become_pid1_of_new_namespace() -> int:
    """Fork; the parent (outside the new pid namespace) waits and mirrors the child's exit.
    Only the child, pid 1 of the namespace, returns: with the read end of a pipe whose EOF says
    the waiter is gone (`_die_with_waiter`; close it when done)."""
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(alive_r)
        # The waiter has nothing to do but wait: it must not run any of the caller's code.
        # SIGTERM/SIGINT sent to the job's process group reach pid 1 too; the waiter just
        # goes on waiting so the status it forwards is pid 1's.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except ChildProcessError:
                os._exit(255)
        _forward_status(status)
    os.close(alive_w)
    # Die with the waiter: whoever kills the job's process (the server's timeout) kills pid 1,
    # and pid 1's death kills the namespace. The pipe closes race-free whether the waiter died
    # before or after prctl: EOF means it is gone.
    _die_with_waiter(alive_r)
    return alive_r


def _die_with_waiter(alive_r: int) -> None:
    """PR_SET_PDEATHSIG, then the race check: EOF on the pipe means the waiter died before it."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "prctl(PR_SET_PDEATHSIG)")
    if select.select([alive_r], [], [], 0)[0]:
        os._exit(255)


def enter_job_jail(scratch: Path, hide: list[Path], keep_fds: list[int], mode: str = "namespaces", *,
                   keep_ro: list[Path] | None = None, shm_bytes: int = 256 << 20,
                   limits: dict[str, int] | None = None, run_as: tuple[int, int] | None = None,
                   private_tmp: bool = False, loopback: bool = False,
                   listed_tops: list[Path] | None = None) -> dict[str, Any]:
    """Enter the job's jail. Call it FIRST in a freshly forked child of the server, after the
    caller has pointed fds 1 and 2 at the job's log, before any candidate code is imported.

    scratch: the job's own directory; the only writable place afterwards (it must exist).
    hide: directories replaced by an empty read-only tmpfs (caches, the store, the scratch
        ROOT holding the other jobs' scratch, the user's home). Missing ones are skipped; one
        that is not a directory fails the jail.
    listed_tops: top-level directories hidden as well, listed by the jail itself just before
        (jail.tops_now): one the host has since replaced by a file is skipped, as top-level
        files are (another process's passing file must not fail this job).
    keep_fds: descriptors the job keeps besides 0, 1, 2 (its channel); all others are closed.
    mode: "namespaces" or "none" (fds closed and a process group of its own: nothing else).
    keep_ro: paths under a hidden directory to bind back read-only (e.g. a virtualenv in the
        home directory, which lazy imports still need).
    shm_bytes: size of the job's private /dev/shm. limits: overrides of DEFAULT_LIMITS.
    run_as: (uid, gid) the job runs as, when the server runs as root (issue 24: files only
        root may read are then out of its reach, and RLIMIT_NPROC holds, which the kernel
        waives for outer uid 0). The user namespace maps 0 to root and this uid to itself; the
        mounts are made as root (which still reaches the interpreter under a 0700 /root), and
        the job switches to the uid last, losing every capability. Scratch is chowned to it;
        the interpreter and its packages must be readable by it (jail_probe checks).
    private_tmp: /tmp becomes a private, writable tmpfs (programs such as ncu keep lock files
        and sockets there); what the interpreter needs under it is bound back read-only.
    loopback: bring the new network namespace's loopback up (ncu talks to its target over it);
        the namespace still has no other interface.
    Returns the description of what holds, for the result's `isolation` field. In
    "namespaces" mode, the caller's process becomes a waiter outside the job that never
    returns: it exits with the job's status. Any failure raises JailError.
    """
    started = time.perf_counter()
    if mode not in ("namespaces", "none"):
        raise ValueError(f"unknown jail mode {mode!r} (namespaces|none)")
    keep = close_inherited_fds(keep_fds)
    if os.getsid(0) != os.getpid():  # a session leader (jail_exec under ncu) already leads its group
        os.setpgid(0, 0)  # the server's timeout kills the job's process group
    if mode == "none":
        return {"mode": "none", "isolated": False, "fds_kept": keep,
                "summary": "no isolation: the job shares the server's namespaces, files and network"}

    scratch = Path(os.path.abspath(scratch))
    tmp = Path("/tmp").resolve()
    named = {Path(os.path.abspath(h)) for h in hide} | ({tmp} if private_tmp else set())
    listed = frozenset(Path(os.path.abspath(t)) for t in (listed_tops or [])) - named
    hides = sorted(named | listed, key=lambda p: len(p.parts))
    keep_ro_paths = [Path(os.path.abspath(p)) for p in (keep_ro or [])]
    if not scratch.is_dir():
        raise JailError(f"scratch directory {scratch} does not exist")
    for h in hides:
        if is_under(h, scratch):
            raise JailError(f"hide path {h} lies inside the scratch directory {scratch}")
    ppid = os.getppid()
    # Die with the server; the getppid check closes the race where the server died before it.
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != ppid:
        os._exit(255)
    euid, egid = os.geteuid(), os.getegid()
    if run_as is not None and (euid != 0 or tuple(run_as) == (0, 0)):
        run_as = None  # only a root server has another uid to give; the job keeps the caller's
    if run_as is not None:
        _chown_tree(scratch, *run_as)
        os.setgroups([])  # root's supplementary groups must not follow the job
    outer_root = _outer_uid_is_root(euid) and run_as is None  # read before our uid_map replaces the view

    # 1. User namespace first (the kernel creates it before the others in the same call, so it
    #    owns them): this gives us the capabilities to mount, also as an unprivileged user.
    # 2. Our own ids, nothing else: inside 0 is outside euid/egid. setgroups must be denied
    #    before an unprivileged gid_map is accepted.
    #    With run_as, the job's uid is mapped to itself besides: a map of two ids must be
    #    written by a process with CAP_SETUID in the parent namespace (_IdMapper, as newuidmap).
    mapper = _IdMapper() if run_as is not None else None
    unshare(JOB_NAMESPACES)
    write_file("/proc/self/setgroups", "deny")
    if mapper is not None:
        mapper.write(f"0 {euid} 1\n{run_as[0]} {run_as[0]} 1\n", f"0 {egid} 1\n{run_as[1]} {run_as[1]} 1\n")
    else:
        write_file("/proc/self/uid_map", f"0 {euid} 1")
        write_file("/proc/self/gid_map", f"0 {egid} 1")
    # 3. unshare(CLONE_NEWPID) moves only our children into the new pid namespace.
    alive_r = _become_pid1_of_new_namespace()

    # 4. Mounts. Nothing we do may propagate back to the host.
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Hold the directories to bring back (scratch, keep_ro) by O_PATH fds before hiding: a bind
    # from /proc/self/fd/N still reaches them once a tmpfs covers their path.
    held = {p: os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for p in [scratch, *keep_ro_paths]}
    # 5. Everything read-only, submounts included. Must come before the binds below, which
    #    would otherwise be made read-only with the rest.
    ro_method = set_readonly("/", True, recursive=True)
    # 6. Hide. A hide path under an already hidden one is gone with it; one the host removes
    #    meanwhile is nothing to hide (mounts.hide_all).
    hidden = hide_all(hides, tmp if private_tmp else None, listed)
    # 7. Bring back scratch (read-write) and keep_ro (read-only). Their mount points may lie
    #    inside a hiding tmpfs, which is still writable at this point: create them there.
    # Outer paths first: a read-only path bound back over a directory that holds the scratch
    # (ncu's own directory, say) would otherwise cover the scratch's writable mount.
    for path, fd in sorted(held.items(), key=lambda item: len(item[0].parts)):
        if any(is_under(path, h) for h in hidden):
            os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
        # The bind copied the source mount's read-only flag: clear it on the scratch mount only
        # (exec stays allowed there: Triton and CUDA builds load the .so files they write).
        set_readonly(path, path != scratch, recursive=False, nosuid_nodev=True)
    # Now the hiding tmpfs may turn read-only (a private /tmp stays writable).
    hidden = [str(h) for h in seal(hidden, tmp if private_tmp else None, list(held))]
    # 8. A private /dev/shm (nothing of the server's or other jobs' segments; gone with the
    #    namespace), and a /proc that shows this pid namespace only. mount(proc) needs pid 1's
    #    namespace, which is why this runs after the fork.
    if os.path.isdir("/dev/shm"):
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(shm_bytes)},mode=1777")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # 9. No nested namespaces: a nested user namespace would hand the job a full (if useless)
    #    capability set; mounts it inherits stay locked read-only, but there is no reason to
    #    allow it at all. These limits belong to our user namespace, so only we can set them.
    blocked = []
    for kind in NESTED_NAMESPACE_LIMITS:
        try:
            write_file(f"/proc/sys/user/max_{kind}_namespaces", "0")
            blocked.append(kind)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise JailError(f"cannot block nested {kind} namespaces: {exc.strerror}") from None
    libc.sethostname(b"kernelagent-job", 15)
    if loopback:
        _loopback_up()
    # 10. Limits, then working directory (the old cwd may be the covered, read-only copy).
    applied: dict[str, Any] = _set_limits({**DEFAULT_LIMITS, **(limits or {})})
    if outer_root:
        applied["nproc"] = "not enforced: the job's outer uid is 0 (the kernel exempts it); see run_as"
    os.chdir(scratch)
    # 11. Last: the job's uid (run_as), then capabilities. After this nothing can be
    #     remounted, unhidden or regained.
    if run_as is not None:
        _become(run_as)
        _die_with_waiter(alive_r)  # a uid change clears PR_SET_PDEATHSIG: set it again
    os.close(alive_r)
    drop_capabilities(keep_setuid_fixup=run_as is not None)
    status = Path("/proc/self/status").read_text()
    cap_eff = next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:"))
    if int(cap_eff, 16) != 0:
        raise JailError(f"capabilities left after dropping them: CapEff={cap_eff}")
    return {
        "mode": "namespaces", "isolated": True,
        "namespaces": ["user", "mount", "pid", "net", "ipc", "uts"],
        "outer_uid": run_as[0] if run_as else euid, "outer_gid": run_as[1] if run_as else egid,
        "readonly_root": ro_method, "hidden": hidden, "keep_ro": [str(p) for p in keep_ro_paths],
        "writable": str(scratch), "dev_shm": f"private tmpfs, {shm_bytes} bytes", "proc": "own pid namespace",
        "network": "loopback only" if loopback else "none (loopback down)",
        "capabilities": "none (bounding set empty, no_new_privs)",
        "nested_namespaces_blocked": blocked, "limits": applied, "fds_kept": keep,
        "setup_ms": round((time.perf_counter() - started) * 1e3, 2),
    }
