"""The MCP `verify` tool: a kernelagent.toml under a root, checked before anything it names is
touched, then judged as `kernelagent verify` judges it (ci/verify.py's rules), read-only.

A manifest is client input like any other argument, wherever it lies: its `problem` and `kernel`
entries must be relative to its folder, without `..`, and reach (links followed) a pinned problem
under a problem root and a file under a root (roots.py). That is checked on the manifest's own
bytes before ci/manifest.py parses it (which looks at the files it names), and again on what it
parsed. The lock next to it is read the same way. Nothing is written: the lock stays as it is
(`kernelagent verify` in CI records new kernels), and no error quotes a file outside the roots.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelagent.mcpserver.roots import BadProblem, Roots
from kernelagent.mcpserver.session import ToolInputError

if TYPE_CHECKING:
    from kernelagent.harness import EvaluatorProtocol


@dataclass
class Checked:
    """A manifest whose every named file was located inside the roots and read."""

    manifest: Any  # ci.manifest.Manifest
    entries: list[tuple[Any, Any, str]]  # (KernelEntry, Problem, the kernel's source)
    lock: dict[str, dict]


def _toml(text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib.loads(text)


def _entry_paths(table: Any) -> list[tuple[int, str, str]]:
    """(kernel number, key, path) of every `problem` and `kernel` string in a parsed manifest."""
    out = []
    entries = table.get("kernel") if isinstance(table, dict) else None
    for index, entry in enumerate(entries if isinstance(entries, list) else [], 1):
        if isinstance(entry, dict):
            for key in ("problem", "kernel"):
                if isinstance(entry.get(key), str):
                    out.append((index, key, entry[key]))
    return out


def check(roots: Roots, value: str, name: str | None) -> Checked:
    """The manifest `value` names (the file, or a folder holding kernelagent.toml), validated."""
    from kernelagent.ci.manifest import MANIFEST_NAME, load_manifest
    from kernelagent.errors import UserError

    try:
        path = roots.locate(value, "manifest")
    except ToolInputError:
        folder = roots.locate(value, "manifest", folder=True)
        path = roots.locate(MANIFEST_NAME, "manifest", base=folder)
    data = roots.read_bytes(path, "manifest")
    digest = hashlib.sha256(data).hexdigest()
    try:
        table = _toml(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ToolInputError(f"`manifest` {value}: not UTF-8 text") from None
    except Exception as exc:  # tomllib.TOMLDecodeError: line and column, no content
        raise ToolInputError(f"`manifest` {value}: not valid TOML ({str(exc).splitlines()[0][:200]})") from None
    base = path.parent
    for index, key, entry in _entry_paths(table):  # before anything looks at the files they name
        _locate_entry(roots, base, index, key, entry)
    try:
        manifest = load_manifest(path)
    except UserError as exc:
        if hashlib.sha256(roots.read_bytes(path, "manifest")).hexdigest() != digest:
            raise ToolInputError(f"`manifest` {value} changed while it was read; try again") from None
        raise ToolInputError(str(exc)) from None
    if manifest.root != base:
        raise ToolInputError(f"`manifest` {value} changed while it was read; try again")
    try:
        selected = manifest.select([name] if name else None)
    except UserError as exc:
        raise ToolInputError(str(exc)) from None
    entries = []
    for entry in selected:  # what was parsed, checked again as it is read through the roots
        where = f"manifest kernel {entry.name!r}"
        try:
            problem = roots.problem(entry.problem_rel, base)
            source = roots.read_text(entry.kernel_rel, "kernel", base)
        except BadProblem as exc:
            raise ToolInputError(f"{where}: bad problem: {exc}") from None
        except ToolInputError as exc:
            raise ToolInputError(f"{where}: {exc}") from None
        entries.append((entry, problem, source))
    return Checked(manifest, entries, _lock(roots, manifest.lock_path, base))


def _locate_entry(roots: Roots, base: Path, index: int, key: str, entry: str) -> Path:
    try:
        return roots.locate(entry, key, problems_only=(key == "problem"), base=base)
    except ToolInputError as exc:
        raise ToolInputError(f"manifest kernel #{index}: {exc}") from None


def _lock(roots: Roots, lock_path: Path, base: Path) -> dict[str, dict]:
    """The lock's entries ({} without one), read through the roots like every other file."""
    import os

    if not os.path.lexists(lock_path):
        return {}
    path = roots.locate(lock_path.name, "lock", base=base)
    try:
        data = json.loads(roots.read_bytes(path, "lock").decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ToolInputError(f"{lock_path.name}: not a readable lock file; delete it and run "
                             "`kernelagent verify --update-lock`") from None
    if not isinstance(data, dict) or not isinstance(data.get("kernels"), dict):
        raise ToolInputError(f"{lock_path.name}: not a kernelagent lock file (no `kernels` object)")
    from kernelagent.ci.lock import LOCK_FORMAT_VERSION

    if data.get("format_version") != LOCK_FORMAT_VERSION:
        raise ToolInputError(f"{lock_path.name}: a lock format this kernelagent does not read")
    return data["kernels"]


class _NoStore:
    """verify's result store, for a server: nothing reused, nothing recorded."""

    def lookup(self, keys: list[str]) -> None:
        return None

    def record_evaluation(self, *args: Any, **kwargs: Any) -> None:
        return None


def run(checked: Checked, evaluator: EvaluatorProtocol, cancel: threading.Event) -> Any:
    """ci/verify.py's judgement of each checked entry, in the manifest's order, with the shared
    harness (each evaluation cancelled with the call); the lock is read, never written."""
    from kernelagent.bench.store import environment as env_of
    from kernelagent.ci.verify import CachedEvaluator, VerifyReport, check_kernel, eval_config
    from kernelagent.problem import sha256_text

    started = time.monotonic()
    cached = CachedEvaluator(evaluator, _NoStore(), "mcp-verify")
    env = env_of(cached.fingerprint())
    checks = []
    for entry, problem, source in checked.entries:
        if cancel.is_set():
            break
        begun = time.monotonic()
        result, reused = cached.evaluate_cached(problem, source, eval_config(checked.manifest, entry, cached.cpu))
        checks.append(check_kernel(entry, result, checked.lock.get(entry.name), environment=env, reused=reused,
                                   seconds=time.monotonic() - begun, kernel_sha256=sha256_text(source),
                                   problem_sha256=problem.sha256))
    return VerifyReport(manifest=checked.manifest.path, lock_path=checked.manifest.lock_path, checks=checks,
                        environment=env, evaluated=cached.performed, reused=cached.reused, lock_written=False,
                        wall_s=time.monotonic() - started)
