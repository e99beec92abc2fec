"""The warm harness is the CLI's default (issue 59 scope 1): `eval`, `profile`, `verify`,
`regenerate` and `mcp` build their Evaluator with daemon=True, and `bench` each device's (one warm
harness per GPU), unless `--no-daemon` or KERNELAGENT_DAEMON=0 says otherwise (`bench --ray`: the
cluster's workers hold their own); the library's Evaluator and EvaluatorPool stay off unless
KERNELAGENT_DAEMON=1, and bench's throughput measurements always run servers of their own. The end-to-end check (a real `eval` reaching a warm harness and `--no-daemon`
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


def _daemon_variable(monkeypatch, variable: str | None) -> None:
    """KERNELAGENT_DAEMON as a row gives it: unset (None) or that value."""
    if variable is None:
        monkeypatch.delenv("KERNELAGENT_DAEMON", raising=False)
    else:
        monkeypatch.setenv("KERNELAGENT_DAEMON", variable)


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

    _daemon_variable(monkeypatch, variable)
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
    _daemon_variable(monkeypatch, variable)
    result = CliRunner().invoke(app, ["mcp", "--problems", str(CANDIDATES), "--device", "cpu", *flags])
    assert result.exit_code == 2 and "server built (test)" in result.output, result.output
    assert len(handed) == 1 and handed[0]["daemon"] is daemon, handed
    harness = Harness("cpu", daemon=handed[0]["daemon"])
    with pytest.raises(Built):
        harness.evaluator()
    assert built[-1]["daemon"] is daemon


LIBRARY = [(None, None, False), ("0", None, False), ("1", None, True), ("1", False, False), (None, True, True)]


@pytest.mark.parametrize("variable,explicit,daemon", LIBRARY, ids=[f"{v}-{e}" for v, e, _ in LIBRARY])
def test_the_librarys_evaluator_and_pool_stay_off_unless_the_variable_says_on(monkeypatch, variable, explicit,
                                                                              daemon):
    """RL trainers and tests embed the Evaluator and the EvaluatorPool (bench's, which hands its
    `daemon` to every device's Evaluator): unset, no warm harness."""
    from kernelagent.harness import Evaluator
    from kernelagent.harness.caller.pool import EvaluatorPool

    _daemon_variable(monkeypatch, variable)
    assert Evaluator(device="cpu", daemon=explicit).daemon_requested is daemon  # nothing starts before a job
    pool = EvaluatorPool(devices=["cpu", "cpu"], daemon=explicit)
    try:
        assert [e.daemon_requested for e in pool.evaluators] == [daemon, daemon]
    finally:
        pool.close()


BENCH_ARGS = ["bench", str(REPO / "tests" / "ci_repo" / "problems"), "--candidates",
              str(REPO / "tests" / "ci_repo" / "kernels"), "--no-live"]
# (the variable, the flags, the Session's daemon): the CLI's rows, then --ray (its workers hold
# their own harnesses: off without a word, whatever the variable says).
BENCH_ROWS = [(v, ["--gpus", "cpu", *f], d) for v, f, d in ROWS] + [
    (None, ["--ray", "auto"], False),
    ("1", ["--ray", "auto"], False),
    ("0", ["--ray", "auto"], False),
]


@pytest.mark.parametrize("variable,flags,daemon", BENCH_ROWS,
                         ids=[f"{v}-{''.join(f[2:] if f[0] == '--gpus' else f) or 'none'}" for v, f, _ in BENCH_ROWS])
def test_bench_uses_a_warm_harness_per_device_by_default(monkeypatch, tmp_path, variable, flags, daemon):
    """`kernelagent bench` resolves --daemon/--no-daemon as the other commands do (on by default,
    off with KERNELAGENT_DAEMON=0: the test suite's own setting, tests/conftest.py), and to off
    with --ray; the run stops where run_bench is called."""
    import kernelagent.bench as bench
    from kernelagent.cli import app

    sessions: list = []

    def run_bench(spec, session, **kwargs):
        sessions.append(session)
        raise Built("run_bench called (test)")

    monkeypatch.setattr(bench, "run_bench", run_bench)
    _daemon_variable(monkeypatch, variable)
    result = CliRunner().invoke(app, [*BENCH_ARGS, "--store", str(tmp_path / "s.sqlite"), *flags],
                                env={"COLUMNS": "120"})
    assert result.exit_code == 2 and "run_bench called (test)" in result.output, result.output
    assert len(sessions) == 1 and sessions[0].daemon is daemon, sessions


def test_bench_passes_its_choice_to_each_devices_evaluator_and_refuses_daemon_with_ray(monkeypatch, tmp_path):
    """What bench resolved reaches the pool (caller/pool.py hands it to every device's
    Evaluator: the library test above); an explicit `--daemon --ray` is one line and exit 2."""
    from kernelagent.cli import app
    from kernelagent.harness.caller import pool

    monkeypatch.delenv("KERNELAGENT_DAEMON", raising=False)
    handed: list[dict] = []

    class Pool:
        def __init__(self, **kwargs):
            handed.append(kwargs)
            raise Built("pool built (test)")

    monkeypatch.setattr(pool, "EvaluatorPool", Pool)
    args = [*BENCH_ARGS, "--store", str(tmp_path / "s.sqlite")]
    for flags, daemon in (([], True), (["--daemon"], True), (["--no-daemon"], False)):
        run = f"r{len(handed)}"
        invoked = CliRunner().invoke(app, [*args, "--gpus", "cpu", *flags, "--run", run, "--out", str(tmp_path / run)],
                                     env={"COLUMNS": "120"})
        assert handed and handed[-1]["daemon"] is daemon, (handed, invoked.output)
    refused = CliRunner().invoke(app, [*args, "--daemon", "--ray", "auto"])
    assert refused.exit_code == 2 and "--daemon and --ray do not go together" in refused.output, refused.output


def _benchmark(name: str, monkeypatch):
    import importlib.util

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # as the scripts run: they import their neighbours
    spec = importlib.util.spec_from_file_location(f"{name}_daemon_t", REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_throughput_measures_servers_of_its_own(built, monkeypatch, tmp_path):
    """benchmarks/bench_throughput.py (and its --overlap, overlap.py) time each batch with its
    servers' start, and sample the host's CPU below their own process: never a warm harness,
    even with KERNELAGENT_DAEMON=1."""
    monkeypatch.setenv("KERNELAGENT_DAEMON", "1")
    throughput = _benchmark("bench_throughput", monkeypatch)
    sessions: list = []

    def run_bench(spec, session, **kwargs):
        sessions.append(session)
        raise Built("run_bench called (test)")

    monkeypatch.setattr(throughput, "run_bench", run_bench)
    for gpus in ("cpu:2", "0,1"):
        with pytest.raises(Built):
            throughput.measure(gpus, tmp_path / "cdir", None, tmp_path, 1)
    assert [s.daemon for s in sessions] == [False, False], sessions

    overlap = _benchmark("overlap", monkeypatch)
    with pytest.raises(Built):  # the priming evaluator
        overlap.compare("level1/1_relu", 1, 1, 2, 0, tmp_path)
    with pytest.raises(Built):  # serial and overlapped
        overlap.run_mode("cpu", tmp_path, [], None, 2)
    assert [b["daemon"] for b in built] == [False, False], built


# (Dispatcher.harness() as the run's record keeps it, the words the progress line and the report show)
HARNESS_WORDS = [
    ({"kind": "warm", "devices": [{"device": "cuda:0", "warm": True, "started_now": True},
                                  {"device": "cuda:1", "warm": True, "started_now": False}]},
     "this user's warm harness per device (1 of 2 started by this session)"),
    ({"kind": "warm", "devices": [{"device": "cuda:0", "warm": True, "started_now": False}]},
     "this user's warm harness per device (found warm)"),
    ({"kind": "own", "devices": [{"device": "cuda:0", "warm": False}]}, "servers of the run's own"),
    ({"kind": "own", "devices": [{"device": "cpu", "warm": False, "why": "not used: /run/x is open to others"}]},
     "servers of the run's own (warm harness not used: /run/x is open to others)"),
    ({"kind": "mixed", "devices": [{"device": "cuda:0", "warm": True}, {"device": "cuda:1", "warm": False}]},
     "this user's warm harness on cuda:0, servers of the run's own on the others"),
    (None, ""),  # a run recorded before the harness was kept: nothing said
    ({"kind": "warm", "devices": "x"}, ""),
]


@pytest.mark.parametrize("harness,words", HARNESS_WORDS, ids=[str(i) for i in range(len(HARNESS_WORDS))])
def test_a_bench_runs_record_says_which_harness_it_used(harness, words):
    """The run's record keeps Dispatcher.harness() (each device's evaluator's isolation.daemon:
    a warm harness, or a server of the run's own and why the warm one was not used); the report's
    header and the progress line say it in words. tests/test_daemon.py has a real run's."""
    from types import SimpleNamespace

    from kernelagent.bench.dispatch import Dispatcher, harness_text
    from kernelagent.bench.report import _env

    assert harness_text(harness) == words
    assert (f"harness: {words}" in _env({"fingerprint": {"harness": harness}})) is bool(words)
    if harness is not None and isinstance(harness["devices"], list):  # what the record is made from
        evaluators = [SimpleNamespace(isolation={"daemon": {"started_now": d.get("started_now"), "socket": "s"}}
                                      if d["warm"] else {"daemon": d["why"]} if "why" in d else {})
                      for d in harness["devices"]]
        made = Dispatcher.harness(SimpleNamespace(labels=[d["device"] for d in harness["devices"]],
                                                  pool=SimpleNamespace(evaluators=evaluators)))
        assert made["kind"] == harness["kind"] and harness_text(made) == words, made
