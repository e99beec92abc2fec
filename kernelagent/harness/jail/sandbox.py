"""The outer layer: the bubblewrap prefix that runs the whole harness server in a sandbox.

Two layers protect a job. This one (bubblewrap around the server) keeps the server and all
its jobs away from the user's home, the network and the host's processes; the inner one
(jail/namespaces.py, entered per job in a forked child) separates the jobs from each other and
from the server's caches. The inner jail must work inside this one, so the prefix never
passes `--disable-userns`: the jail creates a nested user namespace.

When the caller is root, bubblewrap would otherwise hand the server every capability (it
could remount `/` read-write). So as root the prefix drops all capabilities and, where the
kernel allows it (probed), maps the server to an unprivileged uid/gid in a user namespace of
its own. Mapping to a non-zero uid matters for the inner layer too: a process without
CAP_SETFCAP (root after --cap-drop ALL) may not map outer uid 0 into a new user namespace
(Linux >= 5.12), so the per-job jail fails under a root bwrap without --unshare-user.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The ids the server runs as inside bubblewrap's user namespace when the caller is root. Any
# non-zero id works: only the caller's own id is mapped, to this one.
SANDBOX_UID = SANDBOX_GID = 1000

PACKAGE_ROOT = Path(__file__).resolve().parents[3]


# The environment the server (and so every job it forks) gets is an allowlist: what Python,
# torch, Triton, the CUDA toolchain and the harness read. Anything else (DATABASE_URL,
# SENTRY_DSN, SMTP_PASS, GITHUB_PAT, proxies with credentials...) never reaches a candidate,
# whatever its name. Within the allowlist, a name that says it holds a secret, or a value that is
# a URL with credentials in it, is still dropped.
ALLOWED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR", "SHELL", "COLUMNS", "LINES",
    "NO_COLOR", "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
    "PYTHONNOUSERSITE", "PYTHONWARNINGS", "PYTHONFAULTHANDLER", "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH",
    "LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "CC", "CXX", "MAX_JOBS", "CI",
})
ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NVCC_", "CUBLAS", "CUDNN_", "TORCH_", "TORCHINDUCTOR_", "TRITON_",
                    "PYTORCH_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "KERNELAGENT_")
# Any variable whose name contains one of these words is dropped, whatever its case.
SECRET_NAME_PATTERN = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASS$|PAT$|CREDENTIAL|AUTH|DSN|COOKIE|SESSION",
                                 re.I)
CREDENTIAL_URL = re.compile(r"[A-Za-z][\w+.-]*://[^/\s@]*:[^/\s@]*@")


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME_PATTERN.search(name))


def is_allowed(name: str, value: str) -> bool:
    return (name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)) and not is_secret_name(name) \
        and not CREDENTIAL_URL.search(value)


def scrubbed_environ(base: dict[str, str] | None = None) -> dict[str, str]:
    """The allowed part of the environment (ALLOWED_NAMES, ALLOWED_PREFIXES), secrets out."""
    env = dict(os.environ if base is None else base)
    return {k: v for k, v in env.items() if is_allowed(k, v)}


def server_environ() -> dict[str, str]:
    """What a harness server starts from (a plain one, or a zygote that forks them): the allowed
    environment, this package importable first (a checkout that is not installed too), and no
    TRITON_INTERPRET (the server decides from the device it finds)."""
    env = scrubbed_environ()
    env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("TRITON_INTERPRET", None)
    return env


def make_scratch_root() -> Path:
    """A private directory under which each evaluation gets its own scratch folder."""
    return Path(tempfile.mkdtemp(prefix="kernelagent-scratch-"))


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)



@dataclass
class BwrapPrefix:
    """argv: put it in front of the server's command line. info: what the probe found, for
    the result's `isolation` field (both layers: bubblewrap's and the per-job jail's inside)."""

    argv: list[str]
    info: dict[str, Any] = field(default_factory=dict)


def hide_home_args(scratch_root: Path, extra_ro: list[Path]) -> list[str]:
    """bwrap arguments that replace the user's home with an empty tmpfs (its keys, tokens and
    config files out of reach), binding back read-only what Python needs from it: the
    interpreter, its packages and this package, when they live there."""
    home = Path(os.path.expanduser("~")).resolve()
    if str(home) in ("/", "") or not home.is_dir():
        return []
    needed = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), PACKAGE_ROOT,
              *extra_ro, *(Path(p) for p in sys.path if p)]
    keep: list[Path] = []
    for path in needed:
        try:
            path = path.resolve()
        except OSError:
            continue
        if path.exists() and (path == home or home in path.parents):
            if path == home:
                return []  # Python or this package lives in the home directory itself
            if not any(k == path or k in path.parents for k in keep):
                keep = [k for k in keep if path not in k.parents] + [path]
    if scratch_root.resolve() == home or home in scratch_root.resolve().parents:
        keep.append(scratch_root.resolve())
    args = ["--tmpfs", str(home)]
    for path in sorted(keep, key=lambda p: len(p.parts)):
        args += ["--ro-bind", str(path), str(path)]
    return args + ["--remount-ro", str(home)]


def _base_argv(bwrap: str, scratch_root: Path, extra_ro: list[Path], extra_rw: list[Path]) -> list[str]:
    cmd = [
        bwrap, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc",
        # A private /dev/shm for the server; each job gets its own again (jail.py).
        "--tmpfs", "/dev/shm",
    ]
    # Writable places under the home directory get a mount point before the home turns read-only.
    cmd += hide_home_args(scratch_root, extra_ro + extra_rw)
    for path in extra_rw:  # e.g. the cache of built CUDA extensions (written by the server only)
        cmd += ["--bind", str(path), str(path)]
    return cmd + [
        # No private /tmp: the interpreter or a virtualenv may live there (CI clones do).
        "--bind", str(scratch_root), str(scratch_root),
        # A pid namespace: bwrap stays as its pid 1, so nothing the server started survives it.
        # No --die-with-parent: it follows the *thread* that started bwrap, so a server started
        # from a short-lived worker thread would die with it; the server exits by itself when
        # the caller's socket closes.
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        # A new session: no controlling terminal to push keystrokes into (TIOCSTI).
        "--new-session",
    ]


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 20) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None


def probe_jail_inside(argv: list[str], scratch_root: Path) -> dict[str, Any]:
    """Run jail.probe() inside the given prefix: does the per-job jail work in that layer?"""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    code = ("import json, sys; from kernelagent.harness.jail import probe as jail; "
            "print(json.dumps(jail.probe(sys.argv[1])))")
    from kernelagent.harness import interpreter

    done = _run(argv + interpreter.code_argv(code, str(scratch_root)), env=env)
    if done is None or done.returncode != 0:
        err = "timed out or could not start" if done is None else done.stderr.decode(errors="replace")[-300:]
        return {"namespaces_work": False, "error": err.strip()}
    try:
        return json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"namespaces_work": False, "error": "unreadable probe output"}


def bubblewrap_prefix(scratch_root: Path, extra_ro: list[Path] | None = None, extra_rw: list[Path] | None = None,
                      *, unprivileged: bool | None = None, probe_jail: bool = True) -> BwrapPrefix | None:
    """The bwrap prefix for the harness server, or None when bubblewrap is missing or cannot
    create namespaces here.

    Read-only root, the home hidden, a writable scratch root (and `extra_rw`), private /dev/shm,
    pid/net/ipc/uts namespaces, a new session. As root: `--cap-drop ALL`, and with
    `--unshare-user --uid/--gid SANDBOX_UID` when that works (unprivileged=None: probe and use
    it if it works; True: require it; False: do not try). `probe_jail` also runs jail.probe()
    inside the prefix (about 0.2 s) and reports it under info["jail"]: the per-job jail needs
    nested user namespaces, which the outer layer must allow.
    """
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return None
    scratch_root = Path(scratch_root)
    base = _base_argv(bwrap, scratch_root, [Path(p).resolve() for p in (extra_ro or [])],
                      [Path(p).resolve() for p in (extra_rw or [])])
    root = os.geteuid() == 0
    info: dict[str, Any] = {"bubblewrap": True, "caller_root": root}
    candidates: list[tuple[list[str], dict[str, Any]]] = []
    if root:
        drop = ["--cap-drop", "ALL"]
        as_user = drop + ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
        if unprivileged is not False:
            candidates.append((base[:1] + as_user + base[1:], {"user_ns": True, "uid": SANDBOX_UID,
                                                               "capabilities": "none"}))
        if unprivileged is not True:
            candidates.append((base[:1] + drop + base[1:], {"user_ns": False, "uid": 0,
                                                            "capabilities": "none (dropped; uid 0 kept)"}))
    else:
        # Not root: bwrap already makes a user namespace (or is setuid and drops privileges);
        # the server keeps the caller's uid and holds no capability.
        candidates.append((base, {"user_ns": True, "uid": os.geteuid(), "capabilities": "none"}))
    for argv, layer in candidates:
        done = _run(argv + ["true"], timeout=10)
        if done is not None and done.returncode == 0:
            info.update(layer)
            if probe_jail:
                info["jail"] = probe_jail_inside(argv, scratch_root)
            return BwrapPrefix(argv, info)
    return None


def bubblewrap_command(scratch_root: Path, extra_ro: list[Path] | None = None,
                       extra_rw: list[Path] | None = None) -> list[str] | None:
    """Drop-in for the old kernelagent.harness.jail.sandbox.bubblewrap_command (argv or None)."""
    prefix = bubblewrap_prefix(scratch_root, extra_ro, extra_rw, probe_jail=False)
    return prefix.argv if prefix else None
