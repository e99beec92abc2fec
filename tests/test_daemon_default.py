"""The warm harness is the CLI's default (issue 59 scope 1): `eval`, `profile`, `verify`,
`regenerate` and `mcp` build their Evaluator with daemon=True unless `--no-daemon` or
KERNELAGENT_DAEMON=0 says otherwise; the library's Evaluator, and `bench` for now, stay off unless
KERNELAGENT_DAEMON=1. The end-to-end check (a real `eval` reaching a warm harness and `--no-daemon`
a private server) is tests/test_daemon.py's
test_eval_uses_the_warm_harness_by_default_and_no_daemon_a_private_server.

Here each command runs as far as it builds its Evaluator: the recorder below stands in for it,
notes what it was given and stops the command with one line (exit 2), so no server starts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelagent.errors import UserError
from tests.conftest import CANDIDATES, REPO

PROBLEM, GOOD = str(CANDIDATES / "relu_problem.py"), str(CANDIDATES / "relu_good.py")


class Built(UserError):
    """Raised by the recorder: the command stops where it built its Evaluator."""


@pytest.fixture()
def built(monkeypatch):
    """What each Evaluator was built with (its keyword arguments), in order."""
    import kernelagent.harness as harness

    seen: list[dict] = []

    def recorder(**kwargs):
        seen.append(kwargs)
        raise Built("evaluator built (test)")

    monkeypatch.setattr(harness, "Evaluator", recorder)
    return seen


def _ci_repo(tmp_path: Path) -> Path:
    target = tmp_path / "repo"
    shutil.copytree(REPO / "tests" / "ci_repo", target)
    return target


def _command(name: str, tmp_path: Path) -> list[str]:
    if name in ("eval", "profile"):
        return [name, PROBLEM, GOOD, "--device", "cpu"]
    repo = _ci_repo(tmp_path)
    store = ["--store", str(tmp_path / "store.sqlite"), "--device", "cpu"]
    return ["verify", str(repo), *store] if name == "verify" else ["regenerate", str(repo), "--dry-run", *store]


# (the variable, the flags, what the Evaluator is built with)
ROWS = [
    (None, [], True),  # unset: the CLI's default is the warm harness
    (None, ["--no-daemon"], False),  # today's private server
    ("0", [], False),  # off everywhere
    ("0", ["--daemon"], True),  # the flag wins
    ("1", [], True),
    ("1", ["--no-daemon"], False),
]
COMMANDS = ["eval", "profile", "verify", "regenerate"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("variable,flags,daemon", ROWS, ids=[f"{v}-{''.join(f) or 'none'}" for v, f, _ in ROWS])
def test_each_command_builds_its_evaluator_with_the_warm_harness_by_default(built, monkeypatch, tmp_path, command,
                                                                             variable, flags, daemon):
    from kernelagent.cli import app

    if variable is None:
        monkeypatch.delenv("KERNELAGENT_DAEMON", raising=False)
    else:
        monkeypatch.setenv("KERNELAGENT_DAEMON", variable)
    result = CliRunner().invoke(app, [*_command(command, tmp_path), *flags], env={"COLUMNS": "120"})
    assert result.exit_code == 2 and "evaluator built (test)" in result.output, result.output
    assert len(built) == 1 and built[0]["daemon"] is daemon, built


@pytest.mark.parametrize("variable,flags,daemon", ROWS, ids=[f"{v}-{''.join(f) or 'none'}" for v, f, _ in ROWS])
def test_mcp_hands_its_harness_the_warm_harness_by_default(built, monkeypatch, tmp_path, variable, flags, daemon):
    """`kernelagent mcp` resolves the flag (its server is stopped where it is built), and the
    harness its tools share (evaluate, profile, verify: mcpserver/calls.py Harness) builds its
    Evaluator with it."""
    pytest.importorskip("mcp")
    import kernelagent.mcpserver.server as server
    from kernelagent.cli import app
    from kernelagent.mcpserver.calls import Harness

    handed: list[dict] = []

    def build(*args, **kwargs):
        handed.append(kwargs)
        raise Built("server built (test)")

    monkeypatch.setattr(server, "build", build)
    if variable is None:
        monkeypatch.delenv("KERNELAGENT_DAEMON", raising=False)
    else:
        monkeypatch.setenv("KERNELAGENT_DAEMON", variable)
    result = CliRunner().invoke(app, ["mcp", "--problems", str(CANDIDATES), "--device", "cpu", *flags])
    assert result.exit_code == 2 and "server built (test)" in result.output, result.output
    assert len(handed) == 1 and handed[0]["daemon"] is daemon, handed
    harness = Harness("cpu", daemon=handed[0]["daemon"])
    with pytest.raises(Built):
        harness.evaluator()
    assert built[-1]["daemon"] is daemon


LIBRARY = [(None, None, False), ("0", None, False), ("1", None, True), ("1", False, False), (None, True, True)]


@pytest.mark.parametrize("variable,explicit,daemon", LIBRARY, ids=[f"{v}-{e}" for v, e, _ in LIBRARY])
def test_the_librarys_evaluator_and_bench_stay_off_unless_the_variable_says_on(monkeypatch, variable, explicit,
                                                                               daemon):
    """RL trainers and tests embed the Evaluator (and bench's pool): unset, no warm harness."""
    from kernelagent.harness import Evaluator
    from kernelagent.harness.caller.pool import EvaluatorPool

    if variable is None:
        monkeypatch.delenv("KERNELAGENT_DAEMON", raising=False)
    else:
        monkeypatch.setenv("KERNELAGENT_DAEMON", variable)
    assert Evaluator(device="cpu", daemon=explicit).daemon_requested is daemon  # nothing starts before a job
    pool = EvaluatorPool(devices=["cpu", "cpu"], daemon=explicit)
    try:
        assert [e.daemon_requested for e in pool.evaluators] == [daemon, daemon]
    finally:
        pool.close()


def test_bench_passes_its_flag_to_the_pool_and_refuses_it_with_ray(monkeypatch, tmp_path):
    """`bench --daemon` reaches every device's evaluator (caller/pool.py); unset it stays off (not
    yet bench's default); with --ray it is one line and exit 2."""
    from kernelagent.cli import app
    from kernelagent.harness.caller import pool

    monkeypatch.delenv("KERNELAGENT_DAEMON", raising=False)
    handed: list[dict] = []

    class Pool:
        def __init__(self, **kwargs):
            handed.append(kwargs)
            raise Built("pool built (test)")

    monkeypatch.setattr(pool, "EvaluatorPool", Pool)
    args = ["bench", str(REPO / "tests" / "ci_repo" / "problems"), "--candidates",
            str(REPO / "tests" / "ci_repo" / "kernels"), "--gpus", "cpu", "--store", str(tmp_path / "s.sqlite"),
            "--no-live"]
    for flags, daemon in (([], None), (["--daemon"], True), (["--no-daemon"], False)):
        run = f"r{len(handed)}"
        invoked = CliRunner().invoke(app, [*args, *flags, "--run", run, "--out", str(tmp_path / run)],
                                     env={"COLUMNS": "120"})
        assert handed and handed[-1]["daemon"] is daemon, (handed, invoked.output)
    refused = CliRunner().invoke(app, [*[a for a in args if a not in ("--gpus", "cpu")], "--daemon", "--ray", "auto"])
    assert refused.exit_code == 2 and "--daemon and --ray do not go together" in refused.output, refused.output
