"""Folders of this user's own for what the harness shares between its processes on a host: the
Nsight Compute lock files (server/ncu_session.py), the warm harness's sockets (caller/daemon.py).
Issue 54, class 7: a lock file straight in a sticky, world-writable /tmp could be made first by
another local user (theirs, so ours to open no more, or held by them forever), and a name there
could be a link they planted.

A folder is used only while it is a real directory (not a link), owned by this uid, that no one
else may write to (`closed`: the mode bits that must be clear; 0o077 where no one else may even
enter). It is made with mode 0700 where missing. Anything else is NotPrivate, whose message is
one line that says what is wrong and where.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

WRITE_BY_OTHERS = 0o022
ENTER_BY_OTHERS = 0o077


class NotPrivate(OSError):
    """A folder that is not this user's alone (the message says why)."""


def check(path: Path, *, closed: int = WRITE_BY_OTHERS) -> Path:
    """`path` itself, where it is a real directory of this uid with none of `closed`'s mode bits."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise NotPrivate(f"{path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise NotPrivate(f"{path} is not a directory" + (" (a symbolic link)" if stat.S_ISLNK(info.st_mode) else ""))
    if info.st_uid != os.getuid():
        raise NotPrivate(f"{path} belongs to uid {info.st_uid}, not to this user")
    if info.st_mode & closed:
        who = "entered" if closed & 0o055 else "written to"
        raise NotPrivate(f"{path} may be {who} by other users (mode {stat.S_IMODE(info.st_mode):o})")
    return path


def make(path: Path, *, closed: int = WRITE_BY_OTHERS) -> Path:
    """`path`, made (mode 0700, its parent must exist) where missing, then check()ed."""
    path = Path(path)
    try:
        path.mkdir(mode=0o700, exist_ok=True)
    except FileExistsError:
        pass  # a file or a link there: check() says which
    except OSError as exc:
        raise NotPrivate(f"cannot make {path}: {exc.strerror or exc}") from None
    return check(path, closed=closed)


def default_user_dir() -> Path:
    """This user's folder in the temp directory: `<tmp>/kernelagent-<uid>` (the warm harness's
    default runtime folder too)."""
    return Path(tempfile.gettempdir()) / f"kernelagent-{os.getuid()}"


def fresh() -> Path:
    """A new private folder (mkdtemp: 0700, ours), where the usual one is another's."""
    return Path(tempfile.mkdtemp(prefix=f"kernelagent-{os.getuid()}-"))
