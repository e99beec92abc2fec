"""Every `KERNELAGENT_*` environment variable, in one table (issue 57): its type, default and
meaning. docs/reference/settings.md is generated from SETTINGS (docs/hooks.py), and
tests/test_settings.py fails when the package names a variable the table lacks or reads one
other than through `get`.

- `get(name)` reads the variable now (tests and the harness set them for child processes) and
  returns its parsed value, the default where it is unset or empty; a malformed value is a
  SettingError (a ValueError) whose one line names the variable, the value and what was expected.
- `check_environment()` checks every `KERNELAGENT_*` variable of an environment at once: a
  malformed value, or a name the table lacks (a typo: `KERNELAGENT_DAEMOM=1` would otherwise do
  nothing). The CLI calls it before any command runs (cli/__init__.py); the harness's servers
  and children do not: their environment is built by the caller.

Roles: "user" (yours to set), "internal" (set by the harness for its own processes; listed so
that they are known, never to be set by hand) and "tests" (read by the test suite and the device
scripts, not by the package). The bottom room: this module imports nothing of the package, and
nothing heavy, so that every process (a job's child, a `python -I` one) may import it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping, NamedTuple

PREFIX = "KERNELAGENT_"
TYPES = ("bool", "int", "float", "str", "path", "choice")
ROLES = ("user", "internal", "tests")
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class SettingError(ValueError):
    """A KERNELAGENT_* variable with a malformed value, or one no setting has: one line."""


class Setting(NamedTuple):
    name: str
    type: str  # one of TYPES
    default: Any  # the parsed value when the variable is unset or empty (None: the code's own fallback, in doc)
    doc: str
    choices: tuple[str, ...] | None = None  # type "choice": the values allowed (compared lower-cased)
    minimum: float | None = None  # int/float: the least value allowed
    role: str = "user"  # one of ROLES

    @property
    def internal(self) -> bool:
        return self.role == "internal"

    def expected(self) -> str:
        if self.type == "bool":
            return f"a boolean ({', '.join(TRUE)} or {', '.join(FALSE)})"
        if self.type == "choice":
            return f"one of {', '.join(self.choices or ())}"
        if self.type in ("int", "float"):
            what = "an integer" if self.type == "int" else "a finite number"
            return what if self.minimum is None else f"{what} >= {self.minimum:g}"
        return "a path" if self.type == "path" else "a string"

    def parse(self, raw: str | None) -> Any:
        """The value of `raw` (None or blank: the default); SettingError where it is malformed."""
        if raw is None or not raw.strip():
            return self.default
        text = raw.strip()
        if self.type == "str":
            return raw
        if self.type == "path":
            return Path(raw)
        value: Any = None
        if self.type == "bool":
            value = True if text.lower() in TRUE else False if text.lower() in FALSE else None
        elif self.type == "choice":
            value = text.lower() if text.lower() in (self.choices or ()) else None
        elif self.type == "int":
            try:
                value = int(text)
            except ValueError:
                value = None
        elif self.type == "float":
            try:
                value = float(text)
            except ValueError:
                value = None
            if value is not None and not math.isfinite(value):
                value = None
        if value is None or (self.minimum is not None and value < self.minimum):
            raise SettingError(f"{self.name}={raw[:40]!r}: expected {self.expected()}")
        return value


_CACHE = "KERNELAGENT_CACHE_DIR"
SETTINGS: tuple[Setting, ...] = (
    # -- the model and the services -------------------------------------------------------
    Setting("KERNELAGENT_MODEL", "str", None,
            "The litellm model string when `--model` is not given (`optimize`, `bench`, `regenerate`)."),
    Setting("KERNELAGENT_API_BASE", "str", None,
            "The base URL of an OpenAI-compatible server when `--api-base` is not given."),
    Setting("KERNELAGENT_API_KEY", "str", None,
            "The API key when `--api-key` is not given (else the provider's usual variable)."),
    Setting("KERNELAGENT_SERVE_TOKEN", "str", None,
            "The bearer token of `serve` and `mcp --http` when `--token` is not given; RemoteReward "
            "sends the same."),
    # -- where things are kept ------------------------------------------------------------
    Setting(_CACHE, "path", None,
            "The cache root (baselines, bench store, CUDA builds, the tracer, problem facts); unset: "
            "`$XDG_CACHE_HOME/kernelagent`, else `~/.cache/kernelagent`."),
    Setting("KERNELAGENT_RUNTIME_DIR", "path", None,
            "The folder of the warm harness's sockets; unset: `$XDG_RUNTIME_DIR/kernelagent`, else "
            "`/tmp/kernelagent-UID` (UID: yours)."),
    Setting("KERNELAGENT_PROMPTS", "path", None,
            "A folder of prompt templates searched after the packaged ones."),
    Setting("KERNELAGENT_RL_PROBLEMS", "path", None,
            "Where Ray workers write problems received as source text; unset: "
            "`kernelagent-rl-problems` in the temp directory."),
    Setting("KERNELAGENT_NCU", "path", None,
            "The Nsight Compute executable, tried before `ncu` on PATH and `/usr/local/cuda/bin/ncu`."),
    Setting("KERNELAGENT_TRACE_DUMP", "path", None,
            "A folder: each job's raw kernel trace is written there as `JOB.jsonl`, one file per job (probes, GPU tests)."),
    # -- the warm harness -----------------------------------------------------------------
    Setting("KERNELAGENT_DAEMON", "bool", None,
            "This user's warm harness where `--daemon/--no-daemon` is not given: 1 on everywhere, 0 "
            "off everywhere; unset: on for `eval`, `profile`, `verify`, `regenerate`, `mcp` and `bench` "
            "(one per device; never with `--ray`), off for the library's `Evaluator` and `EvaluatorPool` "
            "(RL trainers, tests)."),
    Setting("KERNELAGENT_DAEMON_IDLE_S", "float", 600.0,
            "Seconds a warm harness waits with no connection and no job before it ends (at least 1).",
            minimum=0),
    Setting("KERNELAGENT_BYTECODE", "bool", True,
            "A GPU server byte-compiles, in the background, the installed modules its jailed jobs "
            "import (Inductor first) where they have no bytecode yet, as `pip install` does; 0: off."),
    Setting("KERNELAGENT_SERVER_ZYGOTE", "str", None,
            "The socket of a zygote that forks harness servers with torch imported (the test suite "
            "starts one)."),
    # -- the device and its locks ---------------------------------------------------------
    Setting("KERNELAGENT_DEVICE_LOCK", "bool", True,
            "The host-wide lock of each device, shared by every harness server; 0 turns it off."),
    Setting("KERNELAGENT_DEVICE_LOCK_DIR", "path", None,
            "The folder of the device locks; unset: `/tmp/kernelagent-device-locks`."),
    Setting("KERNELAGENT_DEVICE_LOCK_WAIT_S", "float", 600.0,
            "The longest wait for a device's lock, in seconds.", minimum=0),
    Setting("KERNELAGENT_IDLE_WAIT_S", "float", 30.0,
            "Seconds a server's timing slot waits for the device to go idle.", minimum=0),
    Setting("KERNELAGENT_CUDA_ARCH", "str", "90",
            "The CUDA architecture CUDA candidates are pre-compiled for without a GPU."),
    Setting("KERNELAGENT_CPU_KEEP_BYTES", "int", 256 << 20,
            "On the CPU: the bytes the harness may keep in one process beyond the problem's own.",
            minimum=0),
    Setting("KERNELAGENT_JOB_UID", "int", 65534,
            "The uid a job runs as when the server runs as root; 0 or less: the server's own."),
    # -- the evidence (Nsight Compute, the tracer) ----------------------------------------
    Setting("KERNELAGENT_NCU_LOCK", "choice", "device",
            "How far a server's Nsight Compute session excludes the others: one at a time per device, "
            "or on the host.", choices=("device", "host")),
    Setting("KERNELAGENT_NCU_LOCK_DIR", "path", None,
            "The folder of the Nsight Compute lock files (the caller sets it for its servers); unset: "
            "this user's private folder in the temp directory."),
    Setting("KERNELAGENT_NCU_AS_JOB_UID", "bool", True,
            "Run the Nsight Compute session as the job's uid; 0: as the server's."),
    Setting("KERNELAGENT_FIRST_WAVE_S", "float", 0.5,
            "On a GPU: the k-th job of a server's busy period starts no earlier than this many seconds "
            "x k after the first, until a job takes the timing slot (server/admission.py); 0: all at once.",
            minimum=0),
    Setting("KERNELAGENT_EARLY_EVIDENCE", "int", 3,
            "At most this many evidence sessions start early, beside other jobs, per server; 0: none.",
            minimum=0),
    Setting("KERNELAGENT_EVIDENCE_SPARES", "bool", True,
            "Spare Nsight Compute sessions started ahead for the next job; 0 turns them off."),
    Setting("KERNELAGENT_TRACE", "bool", True,
            "The kernel tracer (CUPTI); 0 turns it off and the evidence stays Nsight Compute's."),
    Setting("KERNELAGENT_SHARED_CALIBRATION", "bool", True,
            "Timed loops' plans and calibrations shared by the servers of this host (kept in the "
            "cache; one server measures each); 0: each server plans and measures its own."),
    Setting("KERNELAGENT_REFERENCE_CONNECTIONS", "int", 1,
            "CUDA_DEVICE_MAX_CONNECTIONS in the reference's process (ours, one stream): its CUDA context "
            "is made and freed under the driver's host-wide lock in about half the time; 0 leaves "
            "CUDA's default. The candidate's process: KERNELAGENT_CANDIDATE_CONNECTIONS.", minimum=0),
    Setting("KERNELAGENT_CANDIDATE_CONNECTIONS", "int", 0,
            "CUDA_DEVICE_MAX_CONNECTIONS in the candidate's process where its source names no stream "
            "or graph (its context made and freed sooner under the driver's host-wide lock); 0, the "
            "default until measured on a GPU: the caller's.", minimum=0),
    Setting("KERNELAGENT_TRITON_WARM", "bool", True,
            "Triton's per-process set-up done by the harness before the candidate's first call; 0 "
            "leaves it to that call."),
    Setting("KERNELAGENT_NCU_NO_NAMESPACES", "bool", False,
            "Behave as on a machine without user namespaces (tests)."),
    # -- set by the harness for its own processes -----------------------------------------
    Setting("KERNELAGENT_COMPILE_WORKERS", "int", None,
            "Inductor's compile workers per job process: the server's share of the host's CPUs.",
            minimum=1, role="internal"),
    Setting("KERNELAGENT_SERVER_DEVICE_KNOWN", "choice", None,
            "The device a restarting server already probed (for that start only).",
            choices=("cuda", "cpu"), role="internal"),
    Setting("KERNELAGENT_TRACE_FD", "int", None,
            "The descriptor the tracer writes to, read by the tracer at cuInit.", minimum=0,
            role="internal"),
    Setting("KERNELAGENT_CANDIDATE_SHA", "str", "unknown",
            "The candidate's hash, for the Nsight Compute target's CUDA build.", role="internal"),
    Setting("KERNELAGENT_NCU_HANDSHAKE", "bool", False,
            "The Nsight Compute target says READY and waits for the device.", role="internal"),
    Setting("KERNELAGENT_NCU_TWO_PHASE", "bool", False,
            "The Nsight Compute target warms up after GO, says WARMED and waits again.", role="internal"),
    Setting("KERNELAGENT_NCU_WAIT_S", "float", 3600.0,
            "The longest the Nsight Compute target waits for the device, in seconds.", minimum=0,
            role="internal"),
    # -- read by the test suite and the device scripts, not by the package ----------------
    Setting("KERNELAGENT_CI_STARTED", "int", None, "The CI run's start (`.ci/run`), in Unix seconds.",
            role="tests"),
    Setting("KERNELAGENT_FULL_CORPUS", "bool", False,
            "tests/test_derived_checks.py: the whole corpus.", role="tests"),
    Setting("KERNELAGENT_GPU_EVIDENCE", "bool", False,
            "The GPU suite: the kernel evidence on for every evaluation.", role="tests"),
    Setting("KERNELAGENT_GPU_FILE_BUDGET_S", "float", None,
            "The GPU suite: every test file's budget in seconds (0 turns them off).", minimum=0,
            role="tests"),
    Setting("KERNELAGENT_SCREENSHOT_DIR", "path", None,
            "tests/test_report_browser.py: a folder for its screenshots.", role="tests"),
    Setting("KERNELAGENT_TEST_API_KEY", "str", None,
            "tests/test_harness.py: a key that must not reach a job.", role="tests"),
    Setting("KERNELAGENT_TEST_ZYGOTE", "bool", True,
            "The test suite's server zygote; 0 turns it off.", role="tests"),
    Setting("KERNELAGENT_TRUST5_SPARE", "bool", False,
            "tests/test_trust5_gpu.py: the spare-session attack (minutes).", role="tests"),
)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of setting `name` in `environ` (os.environ, read now, by default): parsed, or its
    default where unset or blank. A name the table lacks is a KeyError (a bug of ours); a
    malformed value a SettingError."""
    setting = BY_NAME[name]
    return setting.parse((os.environ if environ is None else environ).get(name))


def problems(environ: Mapping[str, str] | None = None, *, unknown: bool = True) -> list[str]:
    """One line for each KERNELAGENT_* variable of `environ` that is malformed, or unknown (where
    `unknown`)."""
    environ = os.environ if environ is None else environ
    found = []
    for name in sorted(environ):
        if not name.startswith(PREFIX):
            continue
        setting = BY_NAME.get(name)
        if setting is None and not unknown:
            continue
        if setting is None:  # its value is not shown: a mistyped key's name may hold a secret
            import difflib

            near = difflib.get_close_matches(name[len(PREFIX):], [n[len(PREFIX):] for n in BY_NAME], n=1)
            hint = f" (did you mean {PREFIX}{near[0]}?)" if near else ""
            found.append(f"{name[:80]} is not a kernelagent setting{hint}; the settings are listed in "
                         "docs/reference/settings.md")
            continue
        try:
            setting.parse(environ[name])
        except SettingError as exc:
            found.append(str(exc))
    return found


def check_environment(environ: Mapping[str, str] | None = None, *, unknown: bool = True) -> None:
    """SettingError (its first problem, one line) where a KERNELAGENT_* variable is malformed or
    (where `unknown`) unknown; nothing otherwise."""
    found = problems(environ, unknown=unknown)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise SettingError(found[0] + more)
