"""Problem code the MCP server runs itself (a problem's input shapes, a whole model's plan):
never in the server's process, never with its environment, and jailed where the jail works.

The problems are trusted (roots.py: pinned at start under --problems), so this is defence in
depth, not the boundary: each run is a child process started from a copy of the pinned source
in a scratch folder of its own, with the allowlisted environment (jail/sandbox.py
`scrubbed_environ`: no API keys, tokens or credentials) and, where the kernel namespaces work
(probed once at start), inside the per-job jail that candidates get (jail/exec_in.py: the
home, the working directory, /tmp, the project folders and the roots hidden, no network, an
unprivileged uid when the server is root). Its output goes to a file the server opened, read
bounded; a run is killed at its time limit or when its call is cancelled.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kernelagent.harness import interpreter
from kernelagent.mcpserver.session import ToolInputError

DESCRIBE_TIMEOUT_S = 120.0
OUTPUT_BYTES = 1 << 20
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class Confinement:
    """How this server runs problem code: the jail (probed once) and its scratch folders."""

    def __init__(self, hide: list[Path], device: str = "cpu") -> None:
        self.parent = Path(tempfile.mkdtemp(prefix="kernelagent-mcp-"))
        os.chmod(self.parent, 0o711)
        self.hide = [p for p in hide if p.is_dir()]
        self.device = device
        self._jail: dict[str, Any] | None = None
        self._lock = threading.Lock()

    @property
    def outputs(self) -> Path:
        """Where the server keeps what it writes for a client (a plan's regions when the call names
        no `out`), beside its runs' scratch folders: removed when the server stops."""
        folder = self.parent / "outputs"
        folder.mkdir(mode=0o755, exist_ok=True)
        return folder

    def jail(self) -> dict[str, Any]:
        """The per-job jail's settings here ({"mode": "none"} where namespaces do not work)."""
        with self._lock:
            if self._jail is None:
                from kernelagent.harness.jail import candidate as jail

                try:
                    self._jail = jail.resolve("auto", self.parent, [str(p) for p in self.hide])
                except Exception as exc:  # noqa: BLE001 - no jail: the allowlisted environment only
                    self._jail = {"mode": "none", "describe": {"mode": "none", "summary": str(exc)[:300]}}
            return self._jail

    def close(self) -> None:
        shutil.rmtree(self.parent, ignore_errors=True)

    def private_copy(self, problem: Any) -> Any:
        """`problem` with its path moved to a copy of its (pinned) source in this server's own
        folder: whatever reads a problem by its path (ncu, in profile) reads that copy."""
        import dataclasses

        folder = self.parent / "problems" / problem.sha256[:24]
        path = folder / problem.path.name
        if not path.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{problem.path.name}.{os.getpid()}.{threading.get_ident()}"
            tmp.write_text(problem.source, encoding="utf-8")
            os.replace(tmp, path)
        return dataclasses.replace(problem, path=path)

    def environment(self, scratch: Path) -> dict[str, str]:
        from kernelagent.harness.jail import sandbox

        env = sandbox.scrubbed_environ()
        env.update(HOME=str(scratch), TMPDIR=str(scratch), PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1",
                   TRITON_CACHE_DIR=str(scratch / ".triton"), TORCHINDUCTOR_CACHE_DIR=str(scratch / ".inductor"))
        env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.pop("TRITON_INTERPRET", None)
        device = self.device
        if device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        elif device.startswith("cuda:"):
            env["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]
        return env

    def run(self, source: str, name: str, argv: list[str], *, timeout: float,
            cancel: threading.Event | None = None, keep: str | None = None) -> "Run":
        """Run `argv` (its "{problem}" and "{scratch}" filled in) on a copy of `source`, in a
        fresh scratch folder; `keep` names a folder of the scratch to hand back (plan's output)."""
        outer = Path(tempfile.mkdtemp(prefix="run-", dir=self.parent))
        os.chmod(outer, 0o711)
        scratch = outer / "job"
        scratch.mkdir()
        problem = scratch / (name if name.endswith(".py") else f"{name}.py")
        problem.write_text(source, encoding="utf-8")
        argv = [a.replace("{problem}", str(problem)).replace("{scratch}", str(scratch)) for a in argv]
        jail = self.jail()
        prefix: list[str] = []
        if jail.get("mode") == "namespaces":
            prefix = interpreter.module_argv("kernelagent.harness.jail.exec_in", "--scratch", str(scratch))
            if jail.get("run_as"):
                prefix += ["--run-as", f"{int(jail['run_as'][0])}:{int(jail['run_as'][1])}"]
            for path in jail.get("hide") or []:  # its home, working directory, roots
                if not Path(path).is_relative_to(scratch):
                    prefix += ["--hide", str(path)]
            prefix += ["--hide-tops", "--"]  # and the top-level folders, listed as it starts
        out_path = outer / "output.log"
        started = time.monotonic()
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(prefix + argv, cwd=scratch, env=self.environment(scratch), stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        killed = None
        while proc.poll() is None:
            if cancel is not None and cancel.is_set():
                killed = "cancelled"
            elif time.monotonic() - started > timeout:
                killed = f"took more than {timeout:.0f} s"
            if killed:
                _kill(proc)
                break
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
        proc.wait()
        return Run(outer, scratch, proc.returncode, _bounded(out_path), killed,
                   jailed=bool(prefix), kept=(scratch / keep) if keep else None)

    def describe_inputs(self, problem: Any, cancel: threading.Event | None = None) -> dict[str, Any]:
        """The shapes and dtypes of a problem's inputs (agent/tools.py's script, on the meta
        device), as read_reference and the task prompt show them."""
        from kernelagent.agent.tools import DESCRIBE_INPUTS

        run = self.run(problem.source, problem.name, interpreter.code_argv(DESCRIBE_INPUTS, "{problem}"),
                       timeout=DESCRIBE_TIMEOUT_S, cancel=cancel)
        try:
            for line in run.output.splitlines():
                if line.startswith("KERNELAGENT_INPUTS "):
                    try:
                        return json.loads(line.split(" ", 1)[1])
                    except ValueError:
                        break
            why = run.killed or (run.output.strip().splitlines() or ["no output"])[-1]
            return {"inputs": {"error": f"could not inspect the inputs: {why[:300]}"}}
        finally:
            run.remove()


class Run:
    def __init__(self, outer: Path, scratch: Path, returncode: int, output: str, killed: str | None,
                 jailed: bool, kept: Path | None) -> None:
        self.outer, self.scratch, self.returncode, self.output = outer, scratch, returncode, output
        self.killed, self.jailed, self.kept = killed, jailed, kept

    def failure(self) -> str | None:
        """Why the run failed, in one line (wholemodel/plan.py's reading of its child), or None."""
        from kernelagent.harness.jail.exec_in import JAIL_FAILED

        if self.killed:
            return f"the run was stopped: {self.killed}"
        for line in self.output.splitlines():
            if line.startswith("KERNELAGENT_ERROR "):
                return line.split(" ", 1)[1]
            if line.startswith("error: "):
                return line[len("error: "):]
        if self.jailed and self.returncode == JAIL_FAILED:
            return "the jail could not be entered: " + (self.output.strip().splitlines() or ["?"])[-1][:300]
        if self.returncode != 0:
            tail = [line for line in self.output.strip().splitlines() if line.strip()][-1:] or ["no output"]
            return f"it failed: {tail[0][:300]}"
        return None

    def remove(self) -> None:
        shutil.rmtree(self.outer, ignore_errors=True)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.kill()


def _bounded(path: Path) -> str:
    """The run's output: its first and last half-megabyte at most."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= OUTPUT_BYTES:
                data = f.read()
            else:
                head = f.read(OUTPUT_BYTES // 2)
                f.seek(size - OUTPUT_BYTES // 2)
                data = head + b"\n[... output cut ...]\n" + f.read()
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def copy_out(run: Run, roots: Any, target: Path, problem: Path) -> tuple[dict[str, Path], bytes | None]:
    """Copy the files of `run.kept` (a plan's folder) to `target` under a root, through folder
    descriptors that never follow a link (roots.py `open_target`); the scratch paths in its JSON
    files become where the files now are. ({relative path: written path}, plan.json's bytes)."""
    if run.kept is None or not run.kept.is_dir():
        raise ToolInputError("the plan wrote nothing")
    written: dict[str, Path] = {}
    plan_json = None
    base_fd, base_path = roots.open_target(target)
    rename = {str(run.kept): str(base_path), str(run.scratch / problem.name): str(problem)}
    try:
        for folder, _dirs, files in os.walk(run.kept):
            rel = Path(folder).relative_to(run.kept)
            dir_fd, dir_path = _subdir(base_fd, base_path, rel)
            try:
                for name in sorted(files):
                    source = Path(folder, name)
                    if source.is_symlink() or not source.is_file():
                        continue
                    data = source.read_bytes()
                    if name.endswith(".json"):
                        text = data.decode("utf-8", errors="replace")
                        for old, new in rename.items():
                            text = text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1])
                        data = text.encode("utf-8")
                        if name == "plan.json" and rel == Path("."):
                            plan_json = data
                    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                                 dir_fd=dir_fd)
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                    path = dir_path / name
                    roots.pin_written(path, data)
                    written[str(rel / name)] = path
            finally:
                if dir_fd != base_fd:
                    os.close(dir_fd)
    except OSError as exc:
        raise ToolInputError(f"the plan could not be written under {target}: {exc.strerror or exc}") from None
    finally:
        os.close(base_fd)
    return written, plan_json


def _subdir(base_fd: int, base_path: Path, rel: Path) -> tuple[int, Path]:
    fd, path = base_fd, base_path
    for part in rel.parts:
        if part in (".", ""):
            continue
        try:
            os.mkdir(part, 0o755, dir_fd=fd)
        except FileExistsError:
            pass
        new = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        if fd != base_fd:
            os.close(fd)
        fd, path = new, path / part
    return fd, path
