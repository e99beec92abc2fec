"""The world of one hostile command (tests/test_hostile.py): a home copied from the template with
canaries in it, the caller's environment, and what is looked at afterwards (processes and files
the attack left, canaries, the cache tree)."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO


def base_env(home: Path, canaries: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KERNELAGENT_CACHE_DIR", "XDG_CACHE_HOME")}
    env.update(PYTHONPATH=str(REPO), HOME=str(home), KERNELAGENT_CACHE_DIR=str(home / ".cache" / "kernelagent"))
    env.update(canaries)
    return env


def tree_hash(root: Path) -> dict[str, str]:
    """Every path under `root` with the hash of its bytes ("dir" for directories). An empty
    `*.lock` is left out: the caller's own flock file, made the first time a problem's baseline
    is looked up (rows on another problem than the template's), carrying nothing."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.suffix == ".lock" and path.is_file() and not path.is_symlink() and path.stat().st_size == 0:
            continue
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() and not path.is_symlink() else "dir"
    return out


def evil_files(home: Path) -> set[Path]:
    found = set()
    for root in (Path("/tmp"), Path("/dev/shm")):
        try:
            found |= {p for p in root.iterdir() if p.name.startswith("ka-evil")}
        except OSError:
            pass
    found |= {p for p in home.rglob("ka-evil*")}
    return found


def evil_processes() -> list[int]:
    pids = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip().startswith("ka-evil"):
                pids.append(int(comm.parent.name))
        except (OSError, ValueError):
            pass
    return pids


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def file_canaries(workdir: Path, token: str) -> dict[str, Path]:
    """Secrets in files (issue 24, class 4), each canary -> the path to remove afterwards: the
    caller's project .env in its working directory; as root also a world-readable file in a
    top-level directory of its own and a root-only 0600 file in /etc."""
    out = {}
    dotenv = f"dotenv-canary-{token}"
    (workdir / ".env").write_text(f"DATABASE_URL=postgres://ka:{dotenv}@db/x\n")
    out[dotenv] = workdir / ".env"
    if os.geteuid() == 0:
        top = Path(f"/ka-canary-top-{token}")
        top.mkdir(mode=0o755)
        (top / "ka-canary-creds").write_text(f"top-canary-{token}\n")
        out[f"top-canary-{token}"] = top
        secret = Path(f"/etc/ka-canary-{token}")
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, f"rootonly-canary-{token}\n".encode())
        os.close(fd)
        out[f"rootonly-canary-{token}"] = secret
    return out


@dataclass
class Scene:
    """One command's world: a home copied from the template (.netrc and caches), canaries in the
    environment, the .netrc and the working directory's name (on the command line)."""
    home: Path
    workdir: Path
    token: str
    env: dict[str, str]
    secrets: list[str]
    cache: Path


def make_scene(template_home: Path, root: Path) -> Scene:
    home = root / "home"
    shutil.copytree(template_home, home, symlinks=True)
    token = secrets.token_hex(12)
    canaries = {"OPENAI_API_KEY": f"sk-canary-{token}", "KA_CANARY_TOKEN": f"tok-canary-{token}"}
    netrc_canary = f"netrc-canary-{token}"
    (home / ".netrc").write_text(f"machine api.example.com login ka password {netrc_canary}\n")
    # The caller's command line carries a canary too (the candidates' paths).
    cmdline_canary = f"cmdline-canary-{token}"
    workdir = root / cmdline_canary
    workdir.mkdir()
    return Scene(home, workdir, token, base_env(home, canaries),
                 list(canaries.values()) + [netrc_canary, cmdline_canary], home / ".cache" / "kernelagent")


def aftermath(home: Path, evil_before: set[Path], secrets_to_hide: list[str], err: str, cache: Path,
               cache_before: dict[str, str]) -> tuple[list[str], list[int], set[Path]]:
    """(a) and (b) after a command: processes and files the attack left (and canaries in those
    files), canaries on stderr, a changed cache tree. Returns (problems, daemons, new files)."""
    problems: list[str] = []
    daemons = evil_processes()
    if daemons:
        problems.append(f"ka-evil processes survived: {daemons}")
    new_files = evil_files(home) - evil_before
    leaked_in_files = []
    for path in new_files:
        try:
            data = path.read_bytes()[: 1 << 20] if path.is_file() else b""
        except OSError:
            data = b""
        leaked_in_files += [x for x in secrets_to_hide if x.encode() in data]
    if new_files:
        problems.append(f"files left behind: {sorted(map(str, new_files))}")
    if leaked_in_files:
        problems.append(f"canary in files left behind: {sorted(set(leaked_in_files))}")
    leaked = [x for x in secrets_to_hide if x in err]
    if leaked:
        problems.append(f"canary in stderr: {leaked}")
    cache_after = tree_hash(cache)
    if cache_after != cache_before:
        changed = sorted(k for k in cache_before.keys() | cache_after.keys() if cache_before.get(k) != cache_after.get(k))
        problems.append("the cache tree changed: " + ", ".join(changed[:6]))
    return problems, daemons, new_files


def clean_up(pids: list[int], paths: set[Path]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for path in paths:
        remove(path)
