"""Settings in one place (issue 57, step 7): every KERNELAGENT_* environment variable the package
names is declared in kernelagent/settings.py (type, default, meaning) and listed on the generated
docs/reference/settings.md; the package reads them only through `settings.get`; a malformed value
or an unknown name is one line and exit 2 before any command runs."""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelagent import settings
from kernelagent.cli import app
from kernelagent.errors import EXIT_USAGE, UserError
from tests.conftest import CANDIDATES, REPO

PACKAGE = REPO / "kernelagent"
NAME = re.compile(r"KERNELAGENT_[A-Z0-9_]+")
# Line tags our processes print to one another on stdout: not environment variables.
MARKERS = frozenset({"KERNELAGENT_NCU_DONE", "KERNELAGENT_NCU_READY", "KERNELAGENT_NCU_WARMED", "KERNELAGENT_NCU_T",
                     "KERNELAGENT_NCU_ABANDONED", "KERNELAGENT_INPUTS", "KERNELAGENT_FACTS", "KERNELAGENT_ERROR",
                     "KERNELAGENT_PLAN", "KERNELAGENT_SPLICED"})
PROBLEM, GOOD = str(CANDIDATES / "relu_problem.py"), str(CANDIDATES / "relu_good.py")


def package_files(*suffixes: str) -> list[Path]:
    return sorted(p for s in suffixes for p in PACKAGE.rglob(f"*{s}") if p.name != "settings.py")


# -- (a) the code names only declared settings, and reads them only through settings.get ---------

def test_every_name_the_package_uses_is_declared():
    """The test that fails when the code reads a variable the settings page lacks."""
    seen = {(name, str(p.relative_to(REPO))) for p in package_files(".py", ".c")
            for name in NAME.findall(p.read_text(encoding="utf-8"))}
    assert len({n for n, _ in seen}) > 30
    missing = sorted((name, where) for name, where in seen if name not in settings.BY_NAME and name not in MARKERS)
    assert not missing, f"declare these in kernelagent/settings.py SETTINGS: {missing}"
    assert not MARKERS & set(settings.BY_NAME)


def test_every_name_the_tests_scripts_and_docs_set_is_declared():
    """The CI and the test suite run commands in their own environment: a variable they set that
    the table lacks would make every command refuse to start."""
    where = [REPO / d for d in ("tests", "scripts", "docs", "benchmarks", "examples", ".ci")] + [REPO / "README.md"]
    files = [p for d in where for p in ([d] if d.is_file() else d.rglob("*"))
             if p.is_file() and p.suffix in (".py", ".sh", ".md", ".yml", ".yaml", "") and p.name != "test_settings.py"]
    missing = sorted({(name, str(p.relative_to(REPO))) for p in files
                      for name in NAME.findall(p.read_text(encoding="utf-8", errors="replace"))
                      if name not in settings.BY_NAME and name not in MARKERS})
    assert not missing, missing


@functools.lru_cache(maxsize=1)
def _constants() -> dict[str, str]:
    """Module-level names of the package bound to a KERNELAGENT_* string (ENV_MODEL = "...")."""
    found: dict[str, str] = {}
    for path in package_files(".py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.Assign):
                continue
            pairs = []
            for target in node.targets:
                if isinstance(target, ast.Name):
                    pairs.append((target, node.value))
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs.extend(zip(target.elts, node.value.elts))
            for target, value in pairs:
                if (isinstance(target, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str)
                        and value.value in settings.BY_NAME):
                    found[target.id] = value.value
    return found


def setting_reads(source: str, constants: dict[str, str]) -> list[str]:
    """Each place `source` reads a declared setting other than through kernelagent.settings:
    `.get(NAME)`, `os.getenv(NAME)`, `environ[NAME]` loaded, `NAME in environ`, and a `.pop(NAME)`
    whose value is used. Writes for a child's environment pass: a subscript stored to or deleted,
    a keyword or dict key, a `.pop` whose value is dropped."""
    tree = ast.parse(source)
    ours = set()  # the names `settings` (the module) and its `get` are bound to here
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "kernelagent":
            ours |= {a.asname or a.name for a in node.names if a.name == "settings"}
        elif isinstance(node, ast.ImportFrom) and node.module == "kernelagent.settings":
            ours |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            ours |= {a.asname for a in node.names if a.name == "kernelagent.settings" and a.asname}
    dropped = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}

    def named(expr: ast.AST) -> str | None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return expr.value if expr.value in settings.BY_NAME else None
        if isinstance(expr, ast.Name):
            return constants.get(expr.id)
        if isinstance(expr, ast.Attribute):
            return constants.get(expr.attr)
        return None

    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Name) and func.id in ours:
                continue
            if isinstance(func, ast.Attribute):
                if isinstance(func.value, ast.Name) and func.value.id in ours:
                    continue
                if func.attr in ("get", "getenv") or (func.attr == "pop" and id(node) not in dropped):
                    key = named(node.args[0])
            elif isinstance(func, ast.Name) and func.id == "getenv":
                key = named(node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            table = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", None)
            key = None if table == "BY_NAME" else named(node.slice)  # the table's row, not the environment
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            key = named(node.left)
        if key:
            found.append(f"line {node.lineno}: {key}")
    return found


# (source, what the check finds): reads of every shape, and the writes it lets pass
READS = [
    ('import os\nx = os.environ.get("KERNELAGENT_DAEMON", "0")', ["line 2: KERNELAGENT_DAEMON"]),
    ('import os\nx = os.getenv("KERNELAGENT_TRACE")', ["line 2: KERNELAGENT_TRACE"]),
    ('from os import getenv\nx = getenv("KERNELAGENT_TRACE")', ["line 2: KERNELAGENT_TRACE"]),
    ('import os\nx = os.environ["KERNELAGENT_CACHE_DIR"]', ["line 2: KERNELAGENT_CACHE_DIR"]),
    ('import os\nif "KERNELAGENT_NCU" in os.environ: pass', ["line 2: KERNELAGENT_NCU"]),
    ('def f(env):\n    return env.get("KERNELAGENT_CACHE_DIR")', ["line 2: KERNELAGENT_CACHE_DIR"]),
    ('import os\nENV_MODEL = "KERNELAGENT_MODEL"\nx = os.environ.get(ENV_MODEL)', ["line 3: KERNELAGENT_MODEL"]),
    ('import os\nknown = os.environ.pop("KERNELAGENT_SERVER_DEVICE_KNOWN", None)',
     ["line 2: KERNELAGENT_SERVER_DEVICE_KNOWN"]),
    ('import os\nos.environ["KERNELAGENT_COMPILE_WORKERS"] = "3"', []),
    ('import os\ndel os.environ["KERNELAGENT_TRACE_FD"]', []),
    ('import os\nos.environ.pop("KERNELAGENT_SERVER_DEVICE_KNOWN", None)', []),
    ('env = dict(PATH="/bin", KERNELAGENT_NCU_HANDSHAKE="1")', []),
    ('env = {"KERNELAGENT_NCU_WAIT_S": "60"}', []),
    ('from kernelagent import settings\nx = settings.get("KERNELAGENT_DAEMON")', []),
    ('from kernelagent.settings import get as setting\nx = setting("KERNELAGENT_DAEMON")', []),
    ('ok = "KERNELAGENT_NCU_DONE" in text', []),  # a line tag, not a variable
    ('from kernelagent.settings import BY_NAME\nx = BY_NAME["KERNELAGENT_DAEMON_IDLE_S"].default', []),
]


@pytest.mark.parametrize("source,expected", READS, ids=[r[0].splitlines()[-1][:50] for r in READS])
def test_the_read_check_tells_reads_from_writes(source, expected):
    assert setting_reads(source, _constants() | {"ENV_MODEL": "KERNELAGENT_MODEL"}) == expected


def test_no_module_reads_a_setting_but_through_settings_get():
    constants = _constants()
    assert constants.get("COMPILE_WORKERS_ENV") == "KERNELAGENT_COMPILE_WORKERS"
    reads = [f"{p.relative_to(REPO)} {where}" for p in package_files(".py")
             for where in setting_reads(p.read_text(encoding="utf-8"), constants)]
    assert not reads, "read these through kernelagent.settings.get: " + "; ".join(reads)


# -- (b) malformed values: one line naming the variable, the value and what was expected --------

MALFORMED = [
    ("KERNELAGENT_DAEMON", "maybe", "KERNELAGENT_DAEMON='maybe': expected a boolean (1, true, yes, on or 0, false, no, off)"),
    ("KERNELAGENT_TRACE", "2", "KERNELAGENT_TRACE='2': expected a boolean"),
    ("KERNELAGENT_EARLY_EVIDENCE", "three", "KERNELAGENT_EARLY_EVIDENCE='three': expected an integer >= 0"),
    ("KERNELAGENT_EARLY_EVIDENCE", "-1", "KERNELAGENT_EARLY_EVIDENCE='-1': expected an integer >= 0"),
    ("KERNELAGENT_EARLY_EVIDENCE", "2.5", "expected an integer >= 0"),
    ("KERNELAGENT_JOB_UID", "nobody", "KERNELAGENT_JOB_UID='nobody': expected an integer"),
    ("KERNELAGENT_DAEMON_IDLE_S", "10m", "KERNELAGENT_DAEMON_IDLE_S='10m': expected a finite number >= 0"),
    ("KERNELAGENT_DEVICE_LOCK_WAIT_S", "nan", "KERNELAGENT_DEVICE_LOCK_WAIT_S='nan': expected a finite number >= 0"),
    ("KERNELAGENT_IDLE_WAIT_S", "inf", "expected a finite number >= 0"),
    ("KERNELAGENT_IDLE_WAIT_S", "-5", "expected a finite number >= 0"),
    ("KERNELAGENT_NCU_LOCK", "gpu", "KERNELAGENT_NCU_LOCK='gpu': expected one of device, host"),
    ("KERNELAGENT_COMPILE_WORKERS", "0", "KERNELAGENT_COMPILE_WORKERS='0': expected an integer >= 1"),
    ("KERNELAGENT_DAEMON", "\x1b]52;c;x\x07" + "y" * 80, "KERNELAGENT_DAEMON='\\x1b]52;c;x\\x07yyyy"),  # escaped, cut
]


@pytest.mark.parametrize("name,value,message", MALFORMED, ids=[f"{n}={v[:12]!r}" for n, v, _ in MALFORMED])
def test_a_malformed_value_is_one_clear_line(name, value, message):
    with pytest.raises(settings.SettingError) as caught:
        settings.get(name, {name: value})
    text = str(caught.value)
    assert text.startswith(f"{name}=") and message in text and "\n" not in text and "\x1b" not in text and len(text) < 200
    with pytest.raises(settings.SettingError, match=re.escape(message)):
        settings.check_environment({name: value})
    assert isinstance(caught.value, ValueError)  # the callers' `except ValueError` fallbacks still hold


WELL_FORMED = [
    ("KERNELAGENT_DAEMON", "1", True), ("KERNELAGENT_DAEMON", " Yes ", True), ("KERNELAGENT_DAEMON", "off", False),
    ("KERNELAGENT_DAEMON", "", None), ("KERNELAGENT_TRACE", "0", False), ("KERNELAGENT_TRACE", "  ", True),
    ("KERNELAGENT_EARLY_EVIDENCE", "0", 0), ("KERNELAGENT_JOB_UID", "-1", -1),
    ("KERNELAGENT_DAEMON_IDLE_S", "2", 2.0), ("KERNELAGENT_NCU_LOCK", " HOST", "host"),
    ("KERNELAGENT_CACHE_DIR", "/x/y", Path("/x/y")), ("KERNELAGENT_CACHE_DIR", "", None),
    ("KERNELAGENT_API_KEY", " sk-a b ", " sk-a b "), ("KERNELAGENT_SERVER_DEVICE_KNOWN", "cuda", "cuda"),
]


@pytest.mark.parametrize("name,value,parsed", WELL_FORMED, ids=[f"{n}={v!r}" for n, v, _ in WELL_FORMED])
def test_a_value_parses(name, value, parsed):
    assert settings.get(name, {name: value}) == parsed
    settings.check_environment({name: value})


def test_an_unknown_name_is_an_error_that_does_not_show_its_value():
    with pytest.raises(settings.SettingError) as caught:
        settings.check_environment({"KERNELAGENT_DAEMOM": "sk-secret", "PATH": "/bin"})
    text = str(caught.value)
    assert text.startswith("KERNELAGENT_DAEMOM is not a kernelagent setting (did you mean KERNELAGENT_DAEMON?)")
    assert "sk-secret" not in text and "docs/reference/settings.md" in text
    settings.check_environment({"KERNELAGENT_DAEMOM": "1"}, unknown=False)  # the Evaluator's check: values only
    found = settings.problems({"KERNELAGENT_XYZZY": "1", "KERNELAGENT_DAEMON": "maybe", "OTHER": "x"})
    assert found == ["KERNELAGENT_DAEMON='maybe': expected a boolean (1, true, yes, on or 0, false, no, off)",
                     "KERNELAGENT_XYZZY is not a kernelagent setting; the settings are listed in docs/reference/settings.md"]
    with pytest.raises(settings.SettingError, match=r"expected a boolean .* \(and 1 more\)$"):
        settings.check_environment({"KERNELAGENT_XYZZY": "1", "KERNELAGENT_DAEMON": "maybe"})


def test_get_reads_the_environment_at_call_time(monkeypatch):
    monkeypatch.delenv("KERNELAGENT_DAEMON", raising=False)
    assert settings.get("KERNELAGENT_DAEMON") is None  # unset: the CLI's default on, the library's off (issue 59)
    monkeypatch.setenv("KERNELAGENT_DAEMON", "on")
    assert settings.get("KERNELAGENT_DAEMON") is True
    with pytest.raises(KeyError):
        settings.get("KERNELAGENT_NOT_DECLARED")


# -- (d) the table itself: its defaults parse, its rows are whole ------------------------------

@pytest.mark.parametrize("setting", settings.SETTINGS, ids=[s.name for s in settings.SETTINGS])
def test_a_default_is_what_an_unset_variable_reads_and_parses_back(setting):
    assert setting.name.startswith(settings.PREFIX) and setting.doc.strip()
    assert setting.type in settings.TYPES and setting.role in settings.ROLES
    assert (setting.choices is not None) == (setting.type == "choice")
    assert setting.minimum is None or setting.type in ("int", "float")
    assert settings.get(setting.name, {}) == setting.default
    if setting.default is None:
        return
    written = {True: "1", False: "0"}.get(setting.default, str(setting.default)) \
        if setting.type == "bool" else str(setting.default)
    assert setting.parse(written) == setting.default
    python_type = {"bool": bool, "int": int, "float": float, "str": str, "choice": str, "path": Path}[setting.type]
    assert type(setting.default) is python_type


def test_the_table_has_one_row_a_name():
    names = [s.name for s in settings.SETTINGS]
    assert len(names) == len(set(names)) == len(settings.BY_NAME)


def test_the_modules_defaults_are_the_tables():
    from kernelagent.harness.caller import daemon
    from kernelagent.harness.server import ncu_session
    from kernelagent.harness.jail import candidate as jail
    from kernelagent.harness.server import device_lock, timed

    assert (daemon.DEFAULT_IDLE_S, device_lock.DEFAULT_WAIT_S, timed.KEEP_CPU_BYTES, jail.DEFAULT_JOB_UID,
            ncu_session.LOCK_SCOPES) == (600.0, 600.0, 256 << 20, 65534, ("device", "host"))


def test_settings_imports_nothing_of_the_package_and_loads_in_an_isolated_python():
    """Loaded alone, from its file, in `python -I`: nothing of the package (nor torch) comes with
    it, so any module, a job's child included, may import it."""
    code = ("import importlib.util as u, sys\n"
            f"spec = u.spec_from_file_location('settings_alone', {str(PACKAGE / 'settings.py')!r})\n"
            "s = u.module_from_spec(spec); spec.loader.exec_module(s)\n"
            "ours = sorted(m for m in sys.modules if m.startswith('kernelagent') or m == 'torch')\n"
            "assert not ours, ours\n"
            "print(s.get('KERNELAGENT_NCU_WAIT_S'), s.get('KERNELAGENT_DAEMON'))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELAGENT_")}
    proc = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          cwd="/")
    assert proc.returncode == 0 and proc.stdout.split() == ["3600.0", "None"], proc.stderr


# -- (c) the CLI: one line, exit 2, before the command runs -------------------------------------

CLI_ROWS = [
    ({"KERNELAGENT_DAEMON": "maybe"}, "error: KERNELAGENT_DAEMON='maybe': expected a boolean"),
    ({"KERNELAGENT_TYPO": "1"}, "error: KERNELAGENT_TYPO is not a kernelagent setting"),
    ({"KERNELAGENT_DAEMON_IDLE": "60"}, "(did you mean KERNELAGENT_DAEMON_IDLE_S?)"),
    ({"KERNELAGENT_NCU_LOCK": "gpu"}, "error: KERNELAGENT_NCU_LOCK='gpu': expected one of device, host"),
]


def _check_one_line(code: int, stdout: str, stderr: str, piece: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == EXIT_USAGE == 2, (stdout, stderr)
    assert len(lines) == 1 and piece in lines[0], stderr
    assert "Traceback" not in stdout + stderr


@pytest.mark.parametrize("env,piece", CLI_ROWS, ids=[next(iter(e)) for e, _ in CLI_ROWS])
@pytest.mark.parametrize("command", [["eval", PROBLEM, GOOD], ["report", "/nonexistent-store.sqlite"]])
def test_the_cli_refuses_a_bad_variable_before_the_command_runs(env, piece, command):
    result = CliRunner().invoke(app, command, env={"CUDA_VISIBLE_DEVICES": "", **env})
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    _check_one_line(result.exit_code, result.stdout, result.stderr, piece)


SCRIPT = Path(sys.executable).parent / "kernelagent"


@pytest.mark.skipif(not SCRIPT.exists(), reason="no kernelagent console script next to this python")
def test_the_console_script_refuses_a_bad_variable():
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "", "KERNELAGENT_DAEMON": "maybe"}
    proc = subprocess.run([str(SCRIPT), "eval", PROBLEM, GOOD], capture_output=True, text=True, env=env, timeout=120)
    _check_one_line(proc.returncode, proc.stdout, proc.stderr, "error: KERNELAGENT_DAEMON='maybe': expected a boolean")


def test_help_and_version_still_work_with_a_bad_variable():
    result = CliRunner().invoke(app, ["--version"], env={"KERNELAGENT_TYPO": "1"})
    assert result.exit_code == 0 and "kernelagent" in result.stdout


def test_a_library_caller_gets_a_user_error_before_any_server_starts(monkeypatch):
    from kernelagent.harness.caller.evaluator import Evaluator

    monkeypatch.setenv("KERNELAGENT_TRACE", "maybe")
    with pytest.raises(UserError, match="KERNELAGENT_TRACE='maybe': expected a boolean"):
        Evaluator(device="cpu")._server_env(Path("/nonexistent-scratch"))


# -- (5) the generated page --------------------------------------------------------------------

def test_the_settings_page_is_generated_from_the_table_and_in_the_nav():
    from tests.test_docs import docs_hooks

    page = (REPO / "docs" / "reference" / "settings.md").read_text()
    hooks = docs_hooks()
    assert hooks.MARK_SETTINGS in page
    assert "reference/settings.md" in (REPO / "mkdocs.yml").read_text()
    generated = hooks.settings_markdown()
    for setting in settings.SETTINGS:
        row = next((line for line in generated.splitlines() if line.startswith(f"| `{setting.name}` |")), "")
        assert hooks.plain(setting.expected()) in row and hooks.plain(setting.doc).replace("|", "\\|") in row, \
            setting.name
    assert len([line for line in generated.splitlines() if line.startswith("| `KERNELAGENT_")]) == len(settings.SETTINGS)
    assert set(hooks.SETTING_ROLES) == set(settings.ROLES)
