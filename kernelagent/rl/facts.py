"""What a prompt needs to know about a problem (its input shapes and dtypes), cached by the
problem's content hash.

Inspecting a problem imports torch in a child process (the problem's file never runs in the
caller's process): seconds per problem. So the result is kept in memory and on disk under
`$KERNELAGENT_CACHE_DIR/problem-facts/<sha256>.json` (else `$XDG_CACHE_HOME/kernelagent`,
else `~/.cache/kernelagent`), keyed by the source's hash: an edited problem is inspected
again, a renamed or moved one is not. Many problems are inspected in one child that imports
torch once, running the very script `optimize` runs per problem (so the facts, and the
prompts rendered from them, are the same).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kernelagent import settings

FACTS_VERSION = 1  # bump when the inspection script's output changes

_lock = threading.Lock()
_memory: dict[str, dict[str, Any]] = {}

# Runs the agent's own inspection script (kernelagent.agent.tools.DESCRIBE_INPUTS) once per
# file, in one process: torch is imported by the first and reused by the rest.
_MANY = r"""
import contextlib, io, json, sys
script = sys.stdin.readline()
script = json.loads(script)
for line in sys.stdin:
    index, path = json.loads(line)
    out = io.StringIO()
    try:
        sys.argv = ["describe", path]
        with contextlib.redirect_stdout(out):
            exec(compile(script, "<describe_inputs>", "exec"), {"__name__": "__main__"})
        found = [l for l in out.getvalue().splitlines() if l.startswith("KERNELAGENT_INPUTS ")]
        facts = json.loads(found[-1].split(" ", 1)[1]) if found else {"inputs": {"error": "could not inspect the inputs: no output"}}
    except BaseException as exc:
        facts = {"inputs": {"error": f"could not inspect the inputs: {type(exc).__name__}: {exc}"[:300]}}
    sys.__stdout__.write("KERNELAGENT_FACTS " + json.dumps([index, facts]) + "\n")
    sys.__stdout__.flush()
"""


def cache_dir() -> Path:
    if settings.get("KERNELAGENT_CACHE_DIR") is not None:
        root = settings.get("KERNELAGENT_CACHE_DIR")
    elif os.environ.get("XDG_CACHE_HOME"):
        root = Path(os.environ["XDG_CACHE_HOME"]) / "kernelagent"
    else:
        root = Path.home() / ".cache" / "kernelagent"
    return root / "problem-facts"


def _path(sha256: str) -> Path:
    return cache_dir() / f"{sha256}.json"


def cached(sha256: str) -> dict[str, Any] | None:
    """The cached input facts of a problem, or None."""
    with _lock:
        if sha256 in _memory:
            return _memory[sha256]
    try:
        data = json.loads(_path(sha256).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != FACTS_VERSION:
        return None
    with _lock:
        _memory[sha256] = data["inputs"]
    return data["inputs"]


def store(sha256: str, inputs: dict[str, Any]) -> None:
    with _lock:
        _memory[sha256] = inputs
    if _failed(inputs):  # a timeout or a crash may pass: try again next time
        return
    path = _path(sha256)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps({"version": FACTS_VERSION, "inputs": inputs}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache costs time, not correctness


def _failed(inputs: dict[str, Any]) -> bool:
    return isinstance(inputs.get("inputs"), dict) and "error" in inputs["inputs"]


def inputs_for(problem: Any) -> dict[str, Any]:
    """The input facts of one Problem (cached; inspected in a child process on a miss)."""
    hit = cached(problem.sha256)
    if hit is not None:
        return hit
    from kernelagent.agent.tools import describe_inputs

    inputs = describe_inputs(str(problem.path))
    store(problem.sha256, inputs)
    return inputs


def inputs_for_many(problems: list[Any], *, timeout: float = 120.0,
                    progress: Callable[[int, int, Any, bool], None] | None = None) -> list[dict[str, Any]]:
    """Input facts for many Problems, in order. Misses are inspected in one child process;
    `progress(done, total, problem, was_cached)` is called as each one is known."""
    out: list[dict[str, Any] | None] = [None] * len(problems)
    todo: list[int] = []
    done = 0
    for i, problem in enumerate(problems):
        hit = cached(problem.sha256)
        if hit is None:
            todo.append(i)
            continue
        out[i] = hit
        done += 1
        if progress:
            progress(done, len(problems), problem, True)
    for i, facts in _inspect(((i, str(problems[i].path)) for i in todo), len(todo), timeout):
        store(problems[i].sha256, facts)
        out[i] = facts
        done += 1
        if progress:
            progress(done, len(problems), problems[i], False)
    return [x if x is not None else {"inputs": {"error": "could not inspect the inputs"}} for x in out]


def _inspect(items: Iterable[tuple[int, str]], count: int, timeout: float):
    """Yield (index, facts) from one child; a problem that hangs past `timeout` ends the
    child, and it is reported as such; the rest go on in a fresh child."""
    from kernelagent.agent.tools import DESCRIBE_INPUTS
    from kernelagent.harness import interpreter

    pending = list(items)
    while pending:
        proc = subprocess.Popen(interpreter.code_argv(_MANY), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(DESCRIBE_INPUTS) + "\n")
            for index, path in pending:
                proc.stdin.write(json.dumps([index, path]) + "\n")
            proc.stdin.close()
        except OSError:
            pass
        seen: set[int] = set()
        timer = _Watchdog(proc, timeout)
        try:
            for line in proc.stdout:
                timer.reset()
                if line.startswith("KERNELAGENT_FACTS "):
                    index, facts = json.loads(line.split(" ", 1)[1])
                    seen.add(index)
                    yield index, facts
        finally:
            timer.stop()
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        rest = [(i, p) for i, p in pending if i not in seen]
        if rest and len(rest) == len(pending) - len(seen):
            # the first unanswered problem is the one that hung or crashed the child
            stuck = rest[0]
            why = "timed out" if timer.fired else "crashed the inspector"
            yield stuck[0], {"inputs": {"error": f"could not inspect the inputs: {why}"}}
            rest = rest[1:]
        pending = rest


class _Watchdog:
    """Kills a child that prints nothing for `timeout` seconds."""

    def __init__(self, proc: subprocess.Popen, timeout: float) -> None:
        self.proc, self.timeout, self.fired = proc, timeout, False
        self._timer: threading.Timer | None = None
        self.reset()

    def _fire(self) -> None:
        self.fired = True
        self.proc.kill()

    def reset(self) -> None:
        self.stop()
        self._timer = threading.Timer(self.timeout, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
