"""External tools that read a candidate's bytes (nvcc and the host compiler of the CPU
pre-compile), run in the candidate's jail, with their diagnostics the only thing that leaves.

A compiler echoes what it reads: an `#include "/root/.netrc"` or a `#line 1 "/etc/shadow"` in a
candidate's source has it quote that file's lines in its errors. So a tool run on a candidate's
sources runs where the candidate's own process would (`ToolJail.of`):
- the job's jail is the per-job namespaces (jail/candidate.py): through jail/exec_in.py, with the
  same hidden directories as the job (the caller's home and working directory, the caches, the
  scratch root with the other jobs', every top-level directory outside the system's), as the
  job's unprivileged uid where the server is root, no network, a private /tmp. A host path
  is then "no such file" to the tool;
- the job's jail is "none" (no namespaces here, or `--isolation none`): candidates run without a
  per-job jail here (inside bubblewrap where it is around the server), and so does the tool.
  That is the jobs' policy (every result's `isolation` says so, and the CLI warns), and the
  result of a pre-compile says it once more (`ToolJail.note`); the static refusal of includes
  outside the build directory (cuda_source.check_includes) still holds.
What comes back is the tool's exit status and its output: the first MAX_OUTPUT_BYTES read (the
rest drained), then cleaned (text.clean_text: no escape sequences or control characters) and
capped at MAX_MESSAGE_CHARS by `bounded_message`.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelagent.harness import interpreter
from kernelagent.harness.jail import sandbox
from kernelagent.harness.jail.exec_in import JAIL_FAILED, JAIL_FAILED_LINE
from kernelagent.text import clean_text

MAX_OUTPUT_BYTES = 256 << 10  # of a tool's output, read; the rest is drained and dropped
MAX_MESSAGE_CHARS = 4000  # of the diagnostics that reach a result


@dataclass
class ToolJail:
    """How a tool runs on a job's bytes: `prefix` goes in front of its command line; `jailed`
    says whether that is the per-job jail; `note` (when not) says so, for the result."""

    prefix: list[str] = field(default_factory=list)
    jailed: bool = False
    note: str = ""

    @classmethod
    def of(cls, jail: dict[str, Any] | None, scratch: Path, keep_ro: list[Path] | None = None) -> "ToolJail":
        """The jail of a job whose jail settings are `jail` (child/jail.resolve's), around a
        tool whose only writable place is `scratch`; `keep_ro`: what the tool reads under a
        hidden directory (its toolchain), bound back read-only."""
        jail = jail or {}
        if jail.get("mode") != "namespaces":
            where = (jail.get("describe") or {}).get("summary") or "no per-job jail"
            return cls([], False, "the compiler ran without the per-job jail, as candidates run here "
                                  f"({str(where)[:200]}); only the refusal of includes outside the build "
                                  "directory held")
        scratch = Path(scratch).resolve()
        prefix = interpreter.module_argv("kernelagent.harness.jail.exec_in", "--scratch", str(scratch))
        run_as = jail.get("run_as")
        if run_as:
            prefix += ["--run-as", f"{int(run_as[0])}:{int(run_as[1])}"]
        for path in jail.get("hide") or []:  # the caller's home and working directory, caches, scratch root
            if not Path(path).resolve().is_relative_to(scratch):
                prefix += ["--hide", str(path)]
        for path in keep_ro or []:  # never one of the tool's own (writable) scratch
            if Path(path).is_dir() and not Path(path).resolve().is_relative_to(scratch):
                prefix += ["--keep-ro", str(path)]
        return cls(prefix + ["--hide-tops", "--"], True, "")

    def environment(self, scratch: Path) -> dict[str, str]:
        """The tool's environment: the allowlisted one (no secrets), its home and temp in scratch."""
        env = sandbox.scrubbed_environ()
        env.update(HOME=str(scratch), TMPDIR=str(scratch / "tmp"), LC_ALL="C")
        env.pop("GCC_COLORS", None)
        return env

    def start(self, argv: list[str], *, cwd: Path, scratch: Path) -> "ToolRun":
        (scratch / "tmp").mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(self.prefix + argv, cwd=cwd, env=self.environment(scratch), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        return ToolRun(proc, jailed=self.jailed)


class ToolRun:
    """One tool's process: its output read in a thread, the first MAX_OUTPUT_BYTES kept."""

    def __init__(self, proc: subprocess.Popen, *, jailed: bool, limit: int = MAX_OUTPUT_BYTES) -> None:
        self.proc, self.jailed, self.limit = proc, jailed, limit
        self.chunks: list[bytes] = []
        self.kept = 0
        self.dropped = 0
        self.reader = threading.Thread(target=self._read, name="kernelagent-tool-output", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        stream = self.proc.stdout
        assert stream is not None
        while True:
            block = stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16)
            if not block:
                break
            room = self.limit - self.kept
            if room > 0:
                self.chunks.append(block[:room])
                self.kept += min(room, len(block))
            self.dropped += max(0, len(block) - max(room, 0))
        stream.close()

    def wait(self, deadline: float) -> bool:
        """Wait until the tool ends or `deadline` (time.monotonic); False when it was killed."""
        try:
            self.proc.wait(timeout=max(0.5, deadline - time.monotonic()))
            finished = True
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, 9)  # the jail's pid 1 dies with it, and all inside
            except OSError:
                pass
            self.proc.wait()
            finished = False
        self.reader.join(5)
        return finished

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    @property
    def jail_failed(self) -> bool:
        """The jail could not be entered (the tool never ran): the harness's fault. Read from the
        status jail_exec gives and the line it writes first, never from the tool's words alone."""
        return self.jailed and self.proc.returncode == JAIL_FAILED \
            and b"".join(self.chunks).startswith(JAIL_FAILED_LINE.encode())

    def output(self) -> str:
        text = b"".join(self.chunks).decode("utf-8", "replace")
        if self.dropped:
            text += f"\n[{self.dropped} more bytes of output dropped]"
        return text


def bounded_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """A tool's diagnostics as a result may carry them: cleaned, at most `limit` characters."""
    text = clean_text(text)
    if len(text) <= limit:
        return text
    return text[:limit - 40].rstrip() + f"\n... [{len(text) - limit + 40} more characters]"
