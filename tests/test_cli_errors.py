"""Every bad input a newcomer is likely to try: its exact exit code, exactly one line on
stderr, and no traceback anywhere. In process (typer's CliRunner) for the whole table, and
through the installed console script for a few rows. Also: help at 80 columns, and an
unreachable --api-base."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelagent.cli import app
from tests.conftest import BENCHMARKS, CANDIDATES, REPO

PROBLEM = str(CANDIDATES / "relu_problem.py")
GOOD = str(CANDIDATES / "relu_good.py")
# No GPU, whatever the machine: an explicit GPU must then be refused.
ENV = {"COLUMNS": "80", "CUDA_VISIBLE_DEVICES": "", "KERNELAGENT_MODEL": None, "KERNELAGENT_API_BASE": None,
       "KERNELAGENT_API_KEY": None}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on exit: a connection is refused


@pytest.fixture
def places(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELAGENT_CACHE_DIR", str(tmp_path / "cache"))
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("not a folder\n")
    earlier = tmp_path / "earlier_run"
    earlier.mkdir()
    (earlier / "summary.json").write_text("{}")
    (earlier / "trajectory.json").write_text("{}")
    return {"tmp": str(tmp_path), "file": str(a_file), "earlier": str(earlier),
            "store": str(tmp_path / "store.sqlite"), "closed": f"http://127.0.0.1:{closed_port()}/v1"}


MODEL = ["--model", "openai/fake", "--api-base"]

# (args with {placeholders}, exit code, a piece of the one stderr line)
TABLE = [
    # 1. numbers: finite and in range, for every numeric option
    (["eval", PROBLEM, GOOD, "--rtol", "nan"], 2, "--rtol': nan is not a finite number"),
    (["eval", PROBLEM, GOOD, "--atol", "-1e-3"], 2, "--atol"),
    (["eval", PROBLEM, GOOD, "--rtol", "inf"], 2, "not a finite number"),
    (["eval", PROBLEM, GOOD, "--trials", "0"], 2, "--trials"),
    (["eval", PROBLEM, GOOD, "--seed", "-1"], 2, "--seed"),
    (["optimize", PROBLEM, "--max-cost", "nan"], 2, "--max-cost"),
    (["optimize", PROBLEM, "--timeout", "inf"], 2, "--timeout"),
    (["optimize", PROBLEM, "--temperature", "nan"], 2, "--temperature"),
    (["optimize", PROBLEM, "--target-speedup", "-1"], 2, "--target-speedup"),
    (["optimize", PROBLEM, "--retry-backoff", "inf"], 2, "--retry-backoff"),
    (["optimize", PROBLEM, "--model-timeout", "nan"], 2, "--model-timeout"),
    (["bench", str(BENCHMARKS), "--max-cost", "inf"], 2, "--max-cost"),
    (["profile", PROBLEM, GOOD, "--ncu-timeout", "nan"], 2, "--ncu-timeout"),
    (["serve", "--r-max", "nan"], 2, "--r-max"),
    (["serve", "--speed-weight", "-inf"], 2, "--speed-weight"),
    (["serve", "--request-timeout", "nan"], 2, "--request-timeout"),
    (["serve", "--eval-config", '{"rtol": NaN}'], 2, "rtol must be a finite number"),
    (["dataset", "prompts", str(BENCHMARKS), "--split", "nan"], 2, "--split"),
    (["export", "sft", "{tmp}", "--min-speedup", "inf"], 2, "--min-speedup"),
    # 2. a GPU that is not there
    (["eval", PROBLEM, GOOD, "--device", "cuda:7"], 2, "--device cuda:7: this machine has no visible GPU"),
    (["eval", PROBLEM, GOOD, "--device", "cuda"], 2, "no visible GPU"),
    (["profile", PROBLEM, GOOD, "--device", "cuda:0"], 2, "no visible GPU"),
    (["optimize", PROBLEM, "--device", "cuda", *MODEL, "{closed}"], 2, "--device cuda: this machine has no visible GPU"),
    (["bench", str(BENCHMARKS), "--candidates", str(BENCHMARKS / "solutions"), "--gpus", "7", "--store", "{store}"],
     2, "--gpus 7: no GPU 7"),
    (["serve", "--gpus", "3"], 2, "--gpus 3: no GPU 3"),
    (["eval", PROBLEM, GOOD, "--device", "tpu"], 2, "--device must be auto, cpu, cuda or cuda:N"),
    # 3. --out
    (["optimize", PROBLEM, *MODEL, "{closed}", "--out", "{file}"], 2, "is a file, not a folder"),
    (["optimize", PROBLEM, *MODEL, "{closed}", "--out", "{file}/sub"], 2, "is a file, not a folder"),
    # 4. an unreachable model server (and no model at all)
    (["optimize", PROBLEM, *MODEL, "{closed}"], 2, "cannot reach the model server at http://127.0.0.1:"),
    (["optimize", PROBLEM, *MODEL, "http://nosuchhost.invalid/v1"], 2, "cannot reach the model server at http://nosuchhost.invalid/v1"),
    (["optimize", PROBLEM, *MODEL, "localhost:8000"], 2, "--api-base must be an http(s) URL"),
    (["optimize", PROBLEM], 2, "no model given"),
    # 6. messages that say what is wrong with what was given
    (["bench", "--resume", "nosuchrun", "--store", "{store}"], 2, "no run 'nosuchrun' in the store"),
    (["eval", PROBLEM, str(CANDIDATES)], 2, "the candidate is a directory, not a file"),
    (["bench", PROBLEM, "--candidates", str(BENCHMARKS / "solutions")], 2, "DIR must be a directory of problem files"),
    (["bench", "{tmp}/nowhere"], 2, "benchmark directory not found"),
    (["eval", "{tmp}/missing.py", GOOD], 2, "problem file not found"),
    (["eval", str(CANDIDATES / "bad_problem_no_model.py"), GOOD], 2, "not a KernelBench problem: missing Model"),
    (["eval", PROBLEM, "{tmp}/missing.py"], 2, "candidate file not found"),
    (["eval", PROBLEM, GOOD, "--isolation", "maybe"], 2, "--isolation must be auto, bwrap, namespaces or none"),
    (["report", "--compare", "a"], 2, "--compare"),
    # usage
    (["eval"], 2, "Missing argument 'PROBLEM'"),
    (["eval", PROBLEM], 2, "Missing argument 'CANDIDATE...'"),
    (["evaluate"], 2, "No such command 'evaluate'"),
    (["eval", PROBLEM, GOOD, "--no-such-flag"], 2, "No such option: --no-such-flag"),
    # the search (issue 26): checked before any model or harness starts
    (["optimize", PROBLEM, *MODEL, "{closed}", "--strategy", "greedy"], 2, "strategy must be one of single, best-of-n"),
    (["optimize", PROBLEM, *MODEL, "{closed}", "--samples", "3"], 2, "--samples above 1 needs a search strategy"),
    (["optimize", PROBLEM, *MODEL, "{closed}", "--resume", "{earlier}"], 2, "not a search run"),
    (["optimize", PROBLEM, *MODEL, "{closed}", "--resume", "{tmp}/nowhere"], 2, "cannot read it"),
    (["bench", str(BENCHMARKS), "--candidates", str(BENCHMARKS / "solutions"), "--strategy", "beam"], 2,
     "--strategy and --samples are for agent mode"),
    # issue 43: these were an internal error (70), or said something else than what is wrong
    (["plan", PROBLEM, "--out", "{file}"], 2, "is a file, not a folder"),
    (["bench", str(BENCHMARKS), "--candidates", str(BENCHMARKS / "solutions"), "--store", "{file}"], 2,
     "cannot open it as a kernelagent store (file is not a database)"),
    (["bench", "{earlier}"], 2, "no problems found under"),
    (["optimize", PROBLEM, "--model", "scripted:{tmp}/nope.py"], 2, "reply file not found"),
    (["optimize", PROBLEM, "--whole-model", "--model", f"scripted:{GOOD}", "--resume", "{tmp}/nowhere"], 2,
     "no whole-model run there"),
]


def fill(args: list[str], places: dict) -> list[str]:
    return [a.format(**places) if "{" in a and "}" in a and not a.startswith("{\"") else a for a in args]


def check_one_line(code: int, stdout: str, stderr: str, expected_code: int, piece: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == expected_code, (stdout, stderr)
    assert len(lines) == 1, f"want one line on stderr, got: {stderr!r}"
    assert lines[0].startswith("error: ") and piece in lines[0], lines[0]
    assert "Traceback" not in stdout + stderr


@pytest.mark.parametrize("args,code,piece", TABLE, ids=[" ".join(a[:1] + a[-2:])[-60:] for a, _c, _p in TABLE])
def test_bad_input_in_process(args, code, piece, places):
    result = CliRunner().invoke(app, fill(args, places), env=ENV)
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    check_one_line(result.exit_code, result.stdout, result.stderr, code, piece)


SCRIPT = Path(sys.executable).parent / "kernelagent"
SCRIPT_ROWS = [0, 19, 23, 27, 32, 33, 34]


@pytest.mark.skipif(not SCRIPT.exists(), reason="no kernelagent console script next to this python")
@pytest.mark.parametrize("row", SCRIPT_ROWS)
def test_bad_input_console_script(row, places):
    args, code, piece = TABLE[row]
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80", "CUDA_VISIBLE_DEVICES": ""}
    for name in ("KERNELAGENT_MODEL", "KERNELAGENT_API_BASE", "KERNELAGENT_API_KEY"):
        env.pop(name, None)
    proc = subprocess.run([str(SCRIPT), *fill(args, places)], capture_output=True, text=True, env=env, timeout=120)
    check_one_line(proc.returncode, proc.stdout, proc.stderr, code, piece)


def test_out_holding_a_run_is_refused_unless_force(places):
    args = ["optimize", PROBLEM, *MODEL, places["closed"], "--out", places["earlier"]]
    result = CliRunner().invoke(app, args, env=ENV)
    check_one_line(result.exit_code, result.stdout, result.stderr, 2, "already holds a run (summary.json, trajectory.json)")
    assert (Path(places["earlier"]) / "summary.json").exists()  # nothing lost
    # --force gets past the check (the closed server then stops it, before anything is deleted)
    result = CliRunner().invoke(app, [*args, "--force"], env=ENV)
    check_one_line(result.exit_code, result.stdout, result.stderr, 2, "cannot reach the model server")


def test_force_clears_the_earlier_run(places):
    from kernelagent.cli.optimize_cmd import check_out

    out = check_out(Path(places["earlier"]), force=True, explicit=True)
    assert out.is_dir() and not any(out.iterdir())


def test_auto_says_it_runs_on_the_cpu(capsys, monkeypatch):
    from kernelagent.devices import CPU_NOTE, check_device, check_gpu_list

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert check_device("auto") == "auto"
    assert capsys.readouterr().err.strip() == CPU_NOTE
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert check_device("cuda:1") == "cuda:1" and check_device("cuda") == "cuda"
    check_gpu_list("0,1")
    with pytest.raises(Exception, match="no such GPU"):
        check_device("cuda:2")
    with pytest.raises(Exception, match="no GPU 4"):
        check_gpu_list("0,4")
    assert capsys.readouterr().err == ""  # a GPU there: auto says nothing


def test_the_machines_gpus_come_from_nvml_once_per_process_without_nvidia_smi(monkeypatch, tmp_path):
    """A warm `eval` asked `nvidia-smi` twice per command (its device check and the note beside
    its verdict). NVML's count is read in the process instead, once; `nvidia-smi` is the
    fallback where NVML does not load, and an NVML that fails to initialise is no answer."""
    import ctypes

    from kernelagent import devices

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    calls = {"init": 0, "count": 0, "shutdown": 0, "smi": 0}

    class FakeNvml:  # ctypes functions: callables whose restype is set
        def __init__(self, init_rc=0, count=4):
            self.init_rc = init_rc

            def init():
                calls["init"] += 1
                return init_rc

            def get_count(ref):
                calls["count"] += 1
                ctypes.cast(ref, ctypes.POINTER(ctypes.c_uint)).contents.value = count
                return 0

            def shutdown():
                calls["shutdown"] += 1
                return 0

            self.nvmlInit_v2, self.nvmlDeviceGetCount_v2, self.nvmlShutdown = init, get_count, shutdown
            self.nvmlDeviceGetClockInfo = lambda *args: 0  # what Nvml.open prepares for the timer

    def smi(*args, **kwargs):
        calls["smi"] += 1
        return subprocess.CompletedProcess(args, 0, "0\n1\n", "")

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(subprocess, "run", smi)
    for library, expected, smi_calls in ((FakeNvml(), [0, 1, 2, 3], 0), (OSError("no libnvidia-ml"), [0, 1], 1),
                                         (FakeNvml(init_rc=9), [0, 1], 1), (FakeNvml(count=1 << 20), [0, 1], 1)):
        calls.update(init=0, count=0, shutdown=0, smi=0)

        def load(name, library=library):
            if isinstance(library, Exception):
                raise library
            return library

        monkeypatch.setattr(ctypes, "CDLL", load)
        devices._machine_gpus.cache_clear()
        try:
            assert devices.check_device("cuda:1") == "cuda:1"
            assert devices.gpu_indices() == expected and devices.gpu_indices() == expected
        finally:
            devices._machine_gpus.cache_clear()  # no fake's answer outlives the test
        assert calls["smi"] == smi_calls  # once at most, whichever answered
        opened = isinstance(library, FakeNvml) and library.init_rc == 0
        assert calls["init"] == isinstance(library, FakeNvml) and calls["shutdown"] == opened
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # the variable still decides first, every time
    assert devices.gpu_indices() == [3]


def test_evalconfig_refuses_bad_numbers():
    from kernelagent.harness import EvalConfig
    from kernelagent.harness.config import StageTimeouts

    for bad in ({"rtol": float("nan")}, {"atol": -1.0}, {"rtol": float("inf")}, {"trials": 0},
                {"target_ms": float("nan")}, {"max_reps": 2, "min_reps": 5}, {"static_check": "maybe"},
                {"timeouts": StageTimeouts(compile=-1)} if False else {"seed": -3}):
        with pytest.raises(ValueError):
            EvalConfig(**bad)
    with pytest.raises(ValueError, match="timeouts.compile"):
        StageTimeouts(compile=float("nan"))
    with pytest.raises(ValueError, match="rtol"):
        EvalConfig.from_dict({"rtol": float("nan")})
    assert EvalConfig.from_dict(EvalConfig(rtol=0.0, atol=1e-3).to_dict()).rtol == 0.0


# -- help ---------------------------------------------------------------------------------
def commands(group=None, prefix=()):
    import typer

    group = group or typer.main.get_command(app)
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from commands(cmd, (*prefix, name))
        else:
            yield (*prefix, name), cmd


from typer.core import TyperOption  # noqa: E402

from kernelagent.cli.core import option_record  # noqa: E402


def unwrap(text: str) -> str:
    """The help as one line of words: wrapped lines joined, a word split at a hyphen rejoined."""
    lines = [line.strip() for line in text.splitlines()]
    out = ""
    for line in lines:
        out += line if out.endswith("-") and not out.endswith(" -") else " " + line
    return " ".join(out.split())


def test_bare_kernelagent_prints_help():
    result = CliRunner().invoke(app, [], env=ENV)
    assert result.exit_code == 0 and result.stdout.startswith("Usage: kernelagent [OPTIONS] COMMAND")
    for group in (["dataset"], ["export"]):
        sub = CliRunner().invoke(app, group, env=ENV)
        assert sub.exit_code == 0 and "Commands:" in sub.stdout


@pytest.mark.parametrize("path,cmd", list(commands()), ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_help_reads_well_at_80_columns(path, cmd):
    result = CliRunner().invoke(app, [*path, "--help"], env=ENV)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "…" not in text and "<bool>" not in text and "<str>" not in text and "<int" not in text
    usage = text.splitlines()[0]
    assert "{" not in usage and usage.startswith(f"Usage: kernelagent {' '.join(path)} [OPTIONS]"), usage
    assert "[[" not in usage, usage  # an optional argument is bracketed once: [PATH], never [[PATH]]
    flat = unwrap(text)
    for param in cmd.params:
        words = " ".join((param.help or "").split())
        assert words in flat, f"help of {param.name} is cut: {words!r}"
        if isinstance(param, TyperOption) and not param.is_flag:
            names = option_record(param)[0]
            assert not names.endswith((" TEXT", " STR")), f"{names}: the metavar does not say what to pass"
            assert names in text, names
    root = CliRunner().invoke(app, ["--help"], env=ENV).stdout
    summary = " ".join((cmd.help or "").strip().split("\n\n")[0].split())
    assert summary in unwrap(root) or len(path) > 1


# -- an unreachable model server ----------------------------------------------------------
def test_unreachable_api_base_is_exit_2_within_seconds(places):
    started = time.monotonic()
    result = CliRunner().invoke(app, ["optimize", PROBLEM, *MODEL, places["closed"], "--out",
                                      places["tmp"] + "/run"], env=ENV)
    elapsed = time.monotonic() - started
    check_one_line(result.exit_code, result.stdout, result.stderr, 2, places["closed"])
    assert elapsed < 10, elapsed


def test_first_call_to_a_server_never_reached_is_not_retried(places):
    """Past the start-up check (the server went down in between): still one attempt, one line."""
    from kernelagent.models.base import ModelConfigError
    from kernelagent.models.litellm_model import LitellmModel

    model = LitellmModel("openai/fake", api_base=places["closed"], max_retries=6, backoff_base=5.0)
    started = time.monotonic()
    with pytest.raises(ModelConfigError, match=re.escape(places["closed"])):
        model.query([{"role": "user", "content": "hi"}])
    assert time.monotonic() - started < 5  # six retries with a 5 s backoff would take minutes


def test_a_server_that_answered_and_went_away_is_retried(places):
    from kernelagent.models.base import ModelConfigError, ModelError
    from kernelagent.models.litellm_model import LitellmModel
    from tests.fake_openai_server import FakeOpenAIServer, text

    with FakeOpenAIServer([text("hello")]) as server:
        model = LitellmModel("openai/fake", api_base=server.url, max_retries=2, backoff_base=0.01)
        assert model.query([{"role": "user", "content": "hi"}]).content == "hello"
    model.api_base = places["closed"]  # the server is gone: refused from now on
    with pytest.raises(ModelError) as info:
        model.query([{"role": "user", "content": "again"}])
    assert not isinstance(info.value, ModelConfigError) and "after 3 attempts" in str(info.value)


# -- the harness's verdicts on broken inputs (these start a harness) ----------------------
def test_bad_problem_details_go_to_stderr(places):
    args = ["eval", str(CANDIDATES / "bad_problem_raises.py"), GOOD, "--no-baselines", "--no-timing"]
    result = CliRunner().invoke(app, args, env=ENV)
    assert result.exit_code == 2 and result.stdout == "", result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    # One line: the CPU note goes beside a verdict, never before an error (issue 43).
    assert len(lines) == 1 and lines[0].startswith("error: bad problem file "), result.stderr
    assert "RuntimeError: broken get_inputs" in lines[0] and "Traceback" not in result.output


def test_binary_candidate_is_the_candidates_verdict(places, tmp_path):
    binary = tmp_path / "candidate.py"
    binary.write_bytes(bytes(range(256)) * 4)
    result = CliRunner().invoke(app, ["eval", PROBLEM, str(binary), "--no-baselines", "--no-timing", "--json"],
                                env=ENV)
    assert result.exit_code == 1, result.output
    import json

    verdict = json.loads(result.stdout)
    assert verdict["status"] == "compile_error" and "not Python source text" in verdict["reason"]


def test_an_unexpected_error_is_one_line_with_the_traceback_in_a_file(places, monkeypatch):
    """A bug of ours, whatever the typer version (0.29's click has no Abort, and naming it hid the
    real error behind an AttributeError): exit 70, one line naming the error and a file holding
    the whole traceback; no escape sequence of the message reaches the terminal."""
    import kernelagent.problem

    def broken(*args, **kwargs):
        raise ValueError("boom \x1b[2J\x1b]52;c;ZXZpbA==\x07 \ud800")

    monkeypatch.setattr(kernelagent.problem, "load_problem", broken)
    result = CliRunner().invoke(app, ["eval", PROBLEM, GOOD], env=ENV)
    assert result.exit_code == 70, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: internal error, ValueError: boom"), lines
    assert "\x1b" not in result.stderr + result.stdout and "Traceback" not in result.stderr + result.stdout
    path = Path(re.search(r"full traceback: (\S+);", lines[0]).group(1))
    assert "Traceback" in path.read_text() and "broken" in path.read_text()
    path.unlink()


def test_candidate_text_reaches_the_terminal_without_control_sequences(places, tmp_path):
    """A candidate's exception message with cursor movement, erase, an OSC 52 clipboard write,
    a bidi override and a lone surrogate: text mode prints it readable and inert."""
    candidate = tmp_path / "cand.py"
    candidate.write_text((CANDIDATES / "relu_good.py").read_text().replace(
        "    y = torch.empty_like(x)\n",
        "    raise RuntimeError('\\x1b[2J\\x1b[1;1Hpwned \\x1b]52;c;ZXZpbA==\\x07 \\u202eevil \\ud800 done')\n", 1))
    result = CliRunner().invoke(app, ["eval", PROBLEM, str(candidate), "--trials", "1"], env=ENV)
    assert result.exit_code == 1, result.output
    shown = result.stdout + result.stderr
    assert "pwned" in shown and "done" in shown
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]", shown), repr(shown[-500:])


@pytest.mark.parametrize("bad", [{"seed": 2**70}, {"weight_seed": 2**63}, {"max_reps": 2**64}, {"trials": 10**30}])
def test_evalconfig_refuses_integers_the_protocol_cannot_carry(bad):
    """Issue 54: every frame refuses integers of 2**63 or more (harness/bounded_json.py); a
    user's --seed 2**70 is one clear line (exit 2), never a frame the server refuses."""
    from kernelagent.harness import EvalConfig

    with pytest.raises(ValueError, match="at most 2\\*\\*62"):
        EvalConfig(**bad)
