"""What isolation works on this machine (`python -m kernelagent.harness.jail.probe`):
each namespace kind, and a full trial of the per-job jail, tried in throwaway forked children
so that nothing changes in the calling process (the server, before it starts jobs)."""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

from kernelagent.harness.jail.mounts import MOUNT_ATTR_RDONLY, MS_PRIVATE, MS_REC, JailError, mount, mount_setattr
from kernelagent.harness.jail.namespaces import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    unshare,
    write_file,
    enter_job_jail,
)


def _in_bubblewrap() -> bool:
    """bwrap leaves no marker; with a pid namespace it stays as pid 1 (its comm is "bwrap"),
    without one it is an ancestor of ours."""
    pid = os.getpid()
    for _ in range(64):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        if comm == "bwrap":
            return True
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
        if pid <= 0:
            break
    try:
        return Path("/proc/1/comm").read_text().strip() == "bwrap"
    except OSError:
        return False


def _in_child(fn) -> dict[str, Any]:
    """Run fn in a throwaway forked child; its result (or error) comes back as JSON."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = {"ok": True, "value": fn()}
        except BaseException as exc:  # noqa: BLE001 - reported, never raised in the child
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        os.write(w, json.dumps(out, default=str).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return {"ok": False, "error": f"probe child died ({os.waitstatus_to_exitcode(status)})"}
    return json.loads(b"".join(chunks))


def _try_unshare(flags: int) -> bool:
    euid, egid = os.geteuid(), os.getegid()
    unshare(CLONE_NEWUSER)
    write_file("/proc/self/setgroups", "deny")
    write_file("/proc/self/uid_map", f"0 {euid} 1")
    write_file("/proc/self/gid_map", f"0 {egid} 1")
    if flags:
        unshare(flags)
    return True


def _try_mount_setattr() -> str:
    _try_unshare(CLONE_NEWNS)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    if not mount_setattr("/", MOUNT_ATTR_RDONLY, 0, True):
        return "unavailable (ENOSYS or unknown architecture): remount fallback"
    return "works"


def _unreadable(paths: list[Path]) -> list[str]:
    """Which of `paths` this process cannot read (inside the jail: what the job will need)."""
    bad = []
    for path in paths:
        if not path.exists():
            continue
        mode = os.R_OK | (os.X_OK if path.is_dir() else 0)
        if not os.access(path, mode):
            bad.append(str(path))
    for dev in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"):
        if os.path.exists(dev) and not os.access(dev, os.R_OK | os.W_OK):
            bad.append(dev)
    return bad


def probe(scratch_root: Path | None = None, hide: list[Path] | None = None, keep_ro: list[Path] | None = None,
          run_as: tuple[int, int] | None = None) -> dict[str, Any]:
    """Which isolation works here, each tried in a throwaway forked child (nothing changes in
    this process), plus a full trial of enter_job_jail with a scratch directory made (and
    removed) under `scratch_root` (default: the temp directory), hiding `hide` and binding back
    `keep_ro` as jobs will. With `run_as` (uid, gid) the trial runs as that uid and checks it can
    read what a job needs (the interpreter, its packages, the GPU's device files); where it
    cannot, the trial is repeated as the current uid and info["run_as_error"] says why. Call it
    from a process that may fork (the server, before it starts jobs); it takes about 10-50 ms."""
    def one(fn) -> bool | str:
        res = _in_child(fn)
        return res["value"] if res["ok"] else f"no: {res['error']}"

    info: dict[str, Any] = {
        "root": os.geteuid() == 0,
        "in_bubblewrap": _in_bubblewrap(),
        "kernel": platform.release(), "arch": platform.machine(),
        "user_ns": one(lambda: _try_unshare(0)),
        "pid_ns": one(lambda: _try_unshare(CLONE_NEWPID)),
        "mount_ns": one(lambda: _try_unshare(CLONE_NEWNS)),
        "net_ns": one(lambda: _try_unshare(CLONE_NEWNET)),
        "ipc_ns": one(lambda: _try_unshare(CLONE_NEWIPC)),
        "mount_setattr": one(_try_mount_setattr),
    }
    try:
        info["inside_user_ns"] = Path("/proc/self/uid_map").read_text().split() != ["0", "0", "4294967295"]
    except OSError:
        info["inside_user_ns"] = None
    needed = [Path(sys.prefix), Path(sys.base_prefix), Path(__file__).resolve().parents[2], *(keep_ro or [])]

    def trial(as_uid: tuple[int, int] | None) -> dict[str, Any]:
        scratch = Path(tempfile.mkdtemp(prefix="kernelagent-jail-probe-", dir=scratch_root))
        try:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                try:
                    desc = enter_job_jail(scratch, list(hide or []), [w], "namespaces", keep_ro=list(keep_ro or []),
                                          run_as=as_uid)
                    bad = _unreadable(needed) if as_uid else []
                    if bad:
                        raise JailError(f"uid {as_uid[0]} cannot read {', '.join(bad[:4])}")
                    os.write(w, json.dumps({"ok": True, "value": desc}).encode())
                except BaseException as exc:  # noqa: BLE001
                    os.write(w, json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}).encode())
                os._exit(0)
            os.close(w)
            data = b""
            while chunk := os.read(r, 65536):
                data += chunk
            os.close(r)
            os.waitpid(pid, 0)
            res = json.loads(data) if data else {"ok": False, "error": "jail trial died"}
            if not res["ok"]:
                raise JailError(res["error"])
            return res["value"]
        finally:
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)

    full = _in_child(lambda: trial(run_as)) if run_as else {"ok": False}
    if full["ok"]:
        info["run_as"] = list(run_as)
    else:
        if run_as:
            info["run_as_error"] = full["error"]
        full = _in_child(lambda: trial(None))
    info["jail"] = full["value"] if full["ok"] else f"no: {full['error']}"
    info["namespaces_work"] = full["ok"]
    return info


if __name__ == "__main__":  # python -m kernelagent.harness.jail.probe: what works on this machine
    json.dump(probe(), sys.stdout, indent=2)
    print()
