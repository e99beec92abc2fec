"""The user's output files: checked before anything is touched, then written whole or not at all.

A command that writes a user's file (a dataset, an export, a report, a JUnit file) first checks
that every output can be written (`check_output_file`), then writes each to a temporary name in
the same folder and renames it into place only once all of them are whole (`write_files`). A
command that fails, at any point, leaves what the user had as it was: an earlier file is never
truncated, and no empty file is left behind.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from kernelagent.errors import UserError


def check_folder(out: Path, label: str, hint: str = "") -> None:
    """UserError (one line) where `out`, or a folder above it, is a file."""
    for parent in [out, *out.parents]:
        if parent.exists() and not parent.is_dir():
            raise UserError((f"{label} is a file, not a folder" if parent == out
                             else f"{label}: {parent} is a file, not a folder") + hint)


def check_output_file(path: str | Path, *, option: str = "--out") -> Path:
    """The path a file can be written at, or a UserError (one line) saying why not. Creates no
    file; may create missing parent folders only when writing (see `write_files`)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{option} {path} is a folder, not a file")
    parent = path.parent
    for up in (parent, *parent.parents):
        if up.exists():
            if not up.is_dir():
                raise UserError(f"{option} {path}: {up} is a file, not a folder")
            if not os.access(up, os.W_OK | os.X_OK):
                raise UserError(f"{option} {path}: cannot write in {up}")
            break
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{option} {path}: the file is not writable")
    why = probe_write(path)
    if why:
        raise UserError(f"{option} {path}: {why}")
    return path


def probe_write(path: str | Path) -> str | None:
    """Why no file can be made beside `path`, found by making (and removing) an empty one in the
    nearest folder that exists; None when one can. os.access says yes to root everywhere, even
    in /proc and on a read-only mount: only a try tells."""
    path = Path(path)
    folder = next((p for p in path.parents if p.exists()), None)
    if folder is None or not folder.is_dir():
        return None  # the checks above name it
    probe = folder / f".{path.name[:40]}.{secrets.token_hex(4)}.probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        where = "" if folder == path.parent else f" (the folder {path.parent} would be made there)"
        return f"cannot write in {folder}{where}: {exc.strerror or exc}"
    os.close(fd)
    os.unlink(probe)
    return None


def write_files(texts: dict[Path, str], *, option: str = "--out") -> None:
    """Write every file of `texts` to a temporary name beside it, then rename each into place.
    Nothing is renamed unless every file was written whole; an OSError becomes a UserError."""
    done: list[tuple[str, Path]] = []
    try:
        for path, text in texts.items():
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = str(path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp"))
            # 0o666 less the umask, as a file the user's shell made (mkstemp's would be 0o600)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            done.append((tmp, path))
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
        for tmp, path in done:
            os.replace(tmp, path)
    except OSError as exc:
        raise UserError(f"{option}: cannot write {exc.filename or ''}: {exc.strerror or exc}".replace(" : ", ": ")) from None
    finally:
        for tmp, _path in done:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass


def write_text(path: str | Path, text: str, *, option: str = "--out") -> None:
    """One file, whole or not at all."""
    write_files({Path(path): text}, option=option)
