"""Which files an MCP client may name, and which of them the server trusts as problems.

Two kinds of folder (`kernelagent mcp --problems DIR --root DIR`):

- problem roots (`--problems`): the operator's problems. Problem code is trusted code (the
  harness runs a problem's reference unjailed, as `kernelagent eval` does), so a problem runs only
  from here, and only as it was when the server started: every `.py` file under these roots is
  hashed at start (`pin`), and a problem that is new or changed since then is refused. A client
  that can write here (a coding agent running as the same user, say) therefore cannot make the
  server run code of its own as a problem; the files the server itself writes here (a plan's
  regions) are pinned as it writes them.
- workspace roots (`--root`): the client's folders. Candidates, manifests and plan outputs may
  be named here; nothing here ever runs as a problem. A workspace root may not overlap a problem
  root.

Every path taken from a tool argument, a manifest entry or a resource template goes through
`locate`: no `..`, no NUL; a relative path is taken under a root (or the manifest's folder); an
absolute one only when it lies in a root; links are followed and the file they reach must lie in
a root too. Files are then read through `read_bytes`: a regular file, bounded in size, opened
without following a last link and checked once more by the descriptor's own path (so a folder
swapped for a link between the check and the read reaches nothing outside). No error message
quotes a file outside the roots (nothing outside is ever read); a path outside them is refused
the same way whether or not it exists.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import stat
import threading
from pathlib import Path

from kernelagent.mcpserver.session import ToolInputError
from kernelagent import pyast

MAX_FILE_BYTES = 4 << 20  # a problem, candidate, manifest or lock larger than this is refused
MAX_PINNED = 20_000  # .py files pinned per server (the rest are not problems it runs)
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", "venv", ".tox",
                       ".mypy_cache", ".pytest_cache", ".ruff_cache"})


class BadProblem(ToolInputError):
    """A trusted (pinned) problem file that is broken: a `bad_problem` verdict with this reason."""


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


class Roots:
    def __init__(self, problems: list[str | Path], workspace: list[str | Path] = ()) -> None:
        self.problem_roots = list(dict.fromkeys(Path(r).resolve() for r in problems))
        self.workspace_roots = [w for w in dict.fromkeys(Path(r).resolve() for r in workspace)
                                if w not in self.problem_roots]
        self.roots = self.problem_roots + self.workspace_roots
        self.pinned: dict[Path, str] = {}  # resolved .py file under a problem root -> sha256 at start
        self.unpinned = 0  # files past MAX_PINNED or MAX_FILE_BYTES (said in the server's log)
        self._is_problem: dict[str, bool] = {}  # sha256 -> parses as a problem
        self._lock = threading.Lock()

    def add_output_root(self, folder: Path) -> Path:
        """The server's own output folder (confined.py's): a problem root holding only what the
        server writes there itself (a plan's regions, pinned as they are written; nothing in it is
        pinned at start), so that the regions of a plan are problems this server runs."""
        folder = Path(folder).resolve()
        if folder not in self.problem_roots:
            self.problem_roots.append(folder)
            self.roots = self.problem_roots + self.workspace_roots
        return folder

    def overlaps(self) -> list[tuple[Path, Path]]:
        """(workspace root, problem root) pairs where one lies inside the other."""
        return [(w, p) for w in self.workspace_roots for p in self.problem_roots
                if w.is_relative_to(p) or p.is_relative_to(w)]

    # -- pinning ---------------------------------------------------------------------------
    def pin(self) -> int:
        """Hash every .py file under the problem roots (links followed only where they stay in
        one): what the server will run as a problem. Returns how many were pinned."""
        for root in self.problem_roots:
            for folder, dirs, files in os.walk(root):  # links to folders are not walked
                dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
                for name in sorted(files):
                    if not name.endswith(".py"):
                        continue
                    if len(self.pinned) >= MAX_PINNED:
                        self.unpinned += 1
                        continue
                    path = Path(folder, name).resolve()
                    if path in self.pinned or not _inside(path, self.problem_roots):
                        continue
                    try:
                        data = self.read_bytes(path, "problem", self.problem_roots)
                    except ToolInputError:
                        self.unpinned += 1
                        continue
                    self.pinned[path] = hashlib.sha256(data).hexdigest()
        return len(self.pinned)

    def pin_written(self, path: Path, data: bytes) -> None:
        """A file the server itself wrote under a problem root (a plan's region)."""
        if path.suffix == ".py" and _inside(path, self.problem_roots):
            with self._lock:
                self.pinned[path] = hashlib.sha256(data).hexdigest()

    # -- naming and reading ----------------------------------------------------------------
    def locate(self, value: object, what: str, *, problems_only: bool = False, base: Path | None = None,
               folder: bool = False) -> Path:
        """The file (or, with `folder`, the directory) `value` names, resolved, inside a root
        (a problem root with `problems_only`). Relative paths are taken under `base` (a
        manifest's folder; then absolute paths are refused) or else under each root in turn."""
        if not isinstance(value, str) or not value.strip():
            raise ToolInputError(f"`{what}` must be a non-empty path")
        if "\x00" in value or len(value) > 4096:
            raise ToolInputError(f"`{what}` is not a usable path")
        try:
            raw = Path(value) if base is not None else Path(value).expanduser()
        except RuntimeError:  # ~user with no such user
            raise ToolInputError(f"`{what}` {value}: no such file under the roots ({self.describe()})") from None
        if ".." in raw.parts:
            raise ToolInputError(f"`{what}` {value}: `..` is not allowed; name files relative to a root "
                                 f"({self.describe()})")
        allowed = self.problem_roots if problems_only else self.roots
        if raw.is_absolute():
            if base is not None:
                raise ToolInputError(f"`{what}` {value}: must be a path relative to the manifest's folder")
            tries = [raw]
        else:
            tries = [base / raw] if base is not None else [root / raw for root in allowed]
        escaped = False
        for path in tries:
            resolved = path.resolve()
            if not _inside(resolved, allowed):
                escaped = True
                continue
            if resolved.is_dir() if folder else resolved.is_file():
                return resolved
        if problems_only:
            try:
                self.locate(value, what, base=base, folder=folder)
            except ToolInputError:
                pass
            else:  # it is a file of the client's folders: never run as a problem
                raise ToolInputError(f"`{what}` {value} is not under a problem root: problems run only from "
                                     f"--problems ({self.describe(True)}), never from the client's folders")
        if escaped:
            kind = "problem roots" if problems_only else "roots"
            raise ToolInputError(f"`{what}` {value} is outside the server's {kind} ({self.describe(problems_only)}), "
                                 "or a link leads out of them; only files under a root can be named")
        raise ToolInputError(f"`{what}` {value}: no such {'folder' if folder else 'file'} under the roots "
                             f"({self.describe(problems_only)})")

    def describe(self, problems_only: bool = False) -> str:
        roots = self.problem_roots if problems_only else self.roots
        return ", ".join(str(r) for r in roots) or "none"

    def read_bytes(self, path: Path, what: str, within: list[Path] | None = None) -> bytes:
        """A regular file's bytes (at most MAX_FILE_BYTES), opened without following a last link
        and checked by the descriptor's own path to lie in `within` (default: every root)."""
        within = self.roots if within is None else within
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise ToolInputError(f"`{what}` {path.name}: cannot be read ({exc.strerror or 'error'})") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ToolInputError(f"`{what}` {path.name}: not a regular file")
            if info.st_size > MAX_FILE_BYTES:
                raise ToolInputError(f"`{what}` {path.name}: larger than {MAX_FILE_BYTES >> 20} MiB")
            try:
                real = Path(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                real = path
            if not _inside(real, within):
                raise ToolInputError(f"`{what}` {path.name}: it left the server's roots while being read")
            chunks, size = [], 0
            while size <= MAX_FILE_BYTES:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            if size > MAX_FILE_BYTES:
                raise ToolInputError(f"`{what}` {path.name}: larger than {MAX_FILE_BYTES >> 20} MiB")
            return b"".join(chunks)
        finally:
            os.close(fd)

    def read_text(self, value: str, what: str, base: Path | None = None) -> str:
        """A candidate (or other client text) under any root, as text (bytes that are not UTF-8
        become U+FFFD, as `read_candidate` does: the harness then calls it broken)."""
        return self.read_bytes(self.locate(value, what, base=base), what).decode("utf-8", errors="replace")

    # -- writing (a plan's output) ------------------------------------------------------------
    def target(self, value: object, what: str, base: Path) -> Path:
        """A folder to write into, named by the client: no `..`; relative to `base` (the root
        that holds the problem); its existing part must lie in a root. Not yet created."""
        if not isinstance(value, str) or not value.strip() or "\x00" in value:
            raise ToolInputError(f"`{what}` must be a non-empty path")
        raw = Path(value)
        if ".." in raw.parts:
            raise ToolInputError(f"`{what}` {value}: `..` is not allowed")
        path = raw if raw.is_absolute() else base / raw
        existing = path
        while not os.path.lexists(existing) and existing != existing.parent:
            existing = existing.parent
        if not _inside(existing.resolve(), self.roots):
            raise ToolInputError(f"`{what}` {value} is outside the server's roots ({self.describe()}), or a link "
                                 "leads out of them")
        return path

    def open_target(self, target: Path) -> tuple[int, Path]:
        """(descriptor, path) of the folder `target`, made where missing: the part that exists is
        checked by the descriptor's own path to lie in a root, and each missing folder is made
        and opened relative to its parent without following a link."""
        existing, missing = target, []
        while not os.path.lexists(existing) and existing != existing.parent:
            missing.insert(0, existing.name)
            existing = existing.parent
        try:
            fd = os.open(existing, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise ToolInputError(f"`out` {target}: not a folder that can be written ({exc.strerror}); give `out` "
                                 "under a --root folder") from None
        try:
            real = Path(os.readlink(f"/proc/self/fd/{fd}"))
            if not _inside(real, self.roots):
                raise ToolInputError(f"`out` {target} is outside the server's roots, or a link leads out of them")
            for part in missing:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                new = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd, real = new, real / part
        except OSError as exc:
            os.close(fd)
            raise ToolInputError(f"`out` {target}: cannot be made ({exc.strerror}); give `out` under a --root "
                                 "folder") from None
        except BaseException:
            os.close(fd)
            raise
        return fd, real

    def root_of(self, path: Path) -> Path:
        """The root `path` (resolved) lies in."""
        return next((r for r in self.roots if path == r or path.is_relative_to(r)), self.roots[0])

    # -- problems ------------------------------------------------------------------------
    def problem(self, value: str, base: Path | None = None) -> object:
        """The trusted problem `value` names: under a problem root, pinned at start and unchanged.
        Raises ToolInputError when it is not trusted, BadProblem when it is trusted but broken."""
        from kernelagent.problem import (REQUIRED_PROBLEM_NAMES, Problem, ProblemError, missing_dependency,
                                         parse_source, sha256_text, top_level_names)

        path = self.locate(value, "problem", problems_only=True, base=base)
        data = self.read_bytes(path, "problem", self.problem_roots)
        with self._lock:
            pinned = self.pinned.get(path)
        if pinned is None:
            raise ToolInputError(f"`problem` {value} was not under --problems when the server started: it runs "
                                 "only the problems it found then (restart it to trust a new file)")
        if hashlib.sha256(data).hexdigest() != pinned:
            raise ToolInputError(f"`problem` {value} changed since the server started: it runs problems only as "
                                 "they were then (restart it to trust this version)")
        try:
            source = data.decode("utf-8")
        except UnicodeDecodeError:
            raise BadProblem(f"{value}: not UTF-8 text") from None
        try:
            tree = parse_source(source, value)
        except ProblemError as exc:
            raise BadProblem(str(exc)) from None
        missing = [n for n in REQUIRED_PROBLEM_NAMES if n not in top_level_names(tree)]
        if missing:
            raise BadProblem(f"{value}: not a KernelBench problem: missing {', '.join(missing)} (a problem "
                             "defines class Model(nn.Module), get_inputs() and get_init_inputs())")
        package = missing_dependency(tree)
        if package is not None:
            raise BadProblem(f"{value}: the problem needs the package {package!r}, which is not installed here")
        level = path.parent.name if re.match(r"^level\d+$", path.parent.name) else None
        return Problem(path=path, source=source, sha256=sha256_text(source), name=path.stem, level=level)

    def problems(self, under: list[Path] | None = None) -> list[Path]:
        """The pinned problems (files that parse as problems) under `under` (default: all)."""
        with self._lock:
            pinned = dict(self.pinned)
        out = []
        for path, digest in pinned.items():
            if under is not None and not _inside(path, under):
                continue
            if digest not in self._is_problem:
                try:
                    data = self.read_bytes(path, "problem", self.problem_roots)
                except ToolInputError:
                    continue
                if hashlib.sha256(data).hexdigest() != digest:
                    continue  # changed since the start: not a problem this server runs
                self._is_problem[digest] = _parses_as_problem(data)
            if self._is_problem[digest]:
                out.append(path)
        return sorted(out)

    def problem_source(self, path: Path) -> str:
        """A listed problem's source, checked against its pin (resources)."""
        data = self.read_bytes(path, "problem", self.problem_roots)
        if hashlib.sha256(data).hexdigest() != self.pinned.get(path):
            raise ToolInputError(f"problem {path.name} changed since the server started")
        return data.decode("utf-8", errors="replace")


def _parses_as_problem(data: bytes) -> bool:
    from kernelagent.problem import REQUIRED_PROBLEM_NAMES, top_level_names

    try:
        tree = pyast.parse(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return False
    return all(name in top_level_names(tree) for name in REQUIRED_PROBLEM_NAMES)
