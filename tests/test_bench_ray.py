"""`kernelagent bench --ray`: the dispatcher's resubmission of work whose worker was lost
(no Ray needed), and, on a local Ray instance with 2 CPU workers, the same metrics as the
single-process run; then a worker process killed with SIGKILL in the middle of an evaluation:
that evaluation runs again elsewhere, nothing is lost or counted twice, and a second run
finds everything done. Ray tests are skipped where ray is not installed (the `rl` extra)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kernelagent.bench.runner import Dispatcher, WorkerLost
from kernelagent.cli import app
from kernelagent.errors import UserError
from tests.conftest import TESTS
from tests.test_bench import CANDIDATES, EXPECTED_EVALUATIONS, PROBLEMS, check_metrics, invoke, last_json

SLOW = ("wall_s", "per_problem")  # wall times differ between any two runs
# Under pytest-xdist the files that start a local Ray run in one worker and alone: beside a second
# worker on 2 cores a Ray actor died mid-bench (ActorDiedError); never one after another.
pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.alone]


# -- the dispatcher, with stand-in workers --------------------------------------------------
class _Progress:
    def eval_started(self, *a, **k): ...
    def eval_finished(self, *a, **k): ...


class _Store:
    def __init__(self):
        self.evaluations, self.attempts = [], []

    def lookup(self, keys):
        return None

    def record_evaluation(self, key, result, **kw):
        self.evaluations.append(key)
        self.attempts.append(kw["attempt"])


class _Worker:
    """Answers plain dicts, as a Ray worker does; `lose` evaluations vanish with the worker."""

    def __init__(self, name, lose=0, revive=True):
        self.name, self.lose, self.can_revive, self.done, self.revived = name, lose, revive, [], 0

    def fingerprint(self):
        return {"python": "x"}

    def evaluate(self, problem, source, config):
        if self.lose:
            self.lose -= 1
            raise WorkerLost(self.name)
        time.sleep(0.01)
        self.done.append(source)
        return {"status": "correct", "compiled": True, "correct": True, "fingerprint": {"python": "x"}}

    def revive(self):
        self.revived += 1
        return self.can_revive

    def close(self):
        pass


class _Pool:
    def __init__(self, workers):
        self.evaluators, self.devices = workers, [w.name for w in workers]


class _Problem:
    sha256, source, display = "p" * 64, "problem", "level1/p"


class _Config:
    def to_dict(self):
        return {"trials": 1}


def _evaluate_all(dispatcher, n):
    results, errors = [], []

    def one(i):
        try:
            results.append(dispatcher.evaluate(_Problem(), f"candidate {i}", _Config(), problem_key="level1/p",
                                               sample=f"s{i}"))
        except UserError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results, errors


def test_lost_evaluations_go_to_another_worker_once():
    store = _Store()
    flaky, steady = _Worker("a", lose=1, revive=False), _Worker("b")
    dispatcher = Dispatcher(_Pool([flaky, steady]), store, "run", _Progress())
    try:
        results, errors = _evaluate_all(dispatcher, 6)
    finally:
        dispatcher.close()
    assert not errors and len(results) == 6 and dispatcher.resubmitted == 1
    assert flaky.revived == 1 and flaky.done == []  # lost for good: it takes nothing more
    assert sorted(steady.done) == [f"candidate {i}" for i in range(6)]  # each once
    assert dispatcher.performed == 6 and len(store.evaluations) == 6
    assert sorted(a["sample"] for a in store.attempts) == [f"s{i}" for i in range(6)]


def test_a_revived_worker_goes_on_and_three_losses_make_a_harness_error():
    store = _Store()
    worker = _Worker("a", lose=3, revive=True)
    dispatcher = Dispatcher(_Pool([worker]), store, "run", _Progress())
    try:
        lost, errors = _evaluate_all(dispatcher, 1)
        after, more_errors = _evaluate_all(dispatcher, 1)  # the revived worker goes on
    finally:
        dispatcher.close()
    assert not errors and not more_errors and dispatcher.resubmitted == 3 and worker.revived == 3
    assert lost[0][0]["status"] == "harness_error" and "lost 3 times" in lost[0][0]["reason"]
    assert store.evaluations[0] and lost[0][1] == store.evaluations[0]
    assert after[0][0]["status"] == "correct" and worker.done == ["candidate 0"]


def test_every_worker_lost_fails_the_rest_with_one_message():
    dispatcher = Dispatcher(_Pool([_Worker("a", lose=10, revive=False)]), _Store(), "run", _Progress())
    try:
        results, errors = _evaluate_all(dispatcher, 3)
    finally:
        dispatcher.close()
    assert not results and len(errors) == 3
    assert all("every harness worker was lost" in str(e) for e in errors)


# -- the CLI's checks -----------------------------------------------------------------------
def test_ray_option_errors(tmp_path):
    base = ["bench", str(PROBLEMS), "--candidates", str(CANDIDATES), "--store", str(tmp_path / "s.sqlite"),
            "--no-live"]
    result = invoke([*base, "--ray", "auto", "--gpus", "cpu"])
    assert result.exit_code == 2 and "--gpus and --ray do not go together" in result.stderr
    # Without ray installed: one line, exit 2, no traceback (ray blocked in a fresh process).
    code = ("import sys; sys.modules['ray'] = None\n"
            "from kernelagent.cli import main; sys.argv = ['kernelagent'] + sys.argv[1:]; main()")
    proc = subprocess.run([sys.executable, "-c", code, *base, "--ray", "auto"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(TESTS.parent)}, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: --ray needs the ray package: pip install 'kernelagent[rl]' (on the driver and on every worker)"]
    assert not (tmp_path / "s.sqlite").exists()


# -- a local Ray instance -------------------------------------------------------------------
def _counts(store: Path) -> tuple[int, list[tuple]]:
    with sqlite3.connect(store, timeout=30) as db:
        log = db.execute("SELECT COUNT(*) FROM evaluation_log").fetchone()[0]
        attempts = db.execute("SELECT problem_key, sample FROM attempts ORDER BY problem_key, sample").fetchall()
    return log, attempts


def _strip(metrics: dict) -> dict:
    out = {k: v for k, v in metrics.items() if k not in SLOW}
    out["by_level"] = {lv: {k: v for k, v in m.items() if k not in SLOW} for lv, m in metrics["by_level"].items()}
    return out


def _harness_processes(marker: str) -> list[str]:
    """Harness servers (and their sandboxes) started for this test: their command lines name its cache."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "kernelagent.harness" in line]


def test_bench_on_ray_matches_one_machine_and_survives_a_lost_worker(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'kernelagent[rl]')")
    from kernelagent.bench import BenchSpec, Session, run_bench
    from kernelagent.bench.ray_pool import RayWorker

    cache = tmp_path / "cache"

    def args(store: str, *extra: str) -> list[str]:
        return ["bench", str(PROBLEMS), "--candidates", str(CANDIDATES), "--trials", "1", "--no-baselines",
                "--store", str(tmp_path / store), "--out", str(tmp_path / store) + ".out", "--cache-dir", str(cache),
                "--cpu-workers", "2", "--no-live", "--json", *extra]

    # 1. one machine, and the same spec on a local Ray instance that `--ray auto` starts and stops
    local = invoke(args("local.sqlite", "--gpus", "cpu"))
    assert local.exit_code == 0, local.output
    on_ray = invoke(args("ray.sqlite", "--ray", "auto"))
    assert on_ray.exit_code == 0, on_ray.output
    assert not ray.is_initialized()  # the instance it started is shut down
    a, b = last_json(local.output), last_json(on_ray.output)
    check_metrics(b["metrics"])
    assert _strip(a["metrics"]) == _strip(b["metrics"]) and a["run_id"] == b["run_id"]
    assert a["evaluations"] == b["evaluations"] == EXPECTED_EVALUATIONS and b["resubmitted"] == 0
    assert "evaluating on ray:" in on_ray.output

    # 2. a worker's process killed while it evaluates: the evaluation runs again on a worker
    # that is alive, the run finishes, and the store has every evaluation exactly once
    killed: list[int] = []
    evaluate = RayWorker.evaluate

    def evaluate_and_kill(self, problem, source, config):
        if not killed:
            killed.append(self.where()["pid"])
            # the kill lands just after the task reached the actor, while it runs
            threading.Timer(0.05, os.kill, (killed[0], signal.SIGKILL)).start()
        return evaluate(self, problem, source, config)

    monkeypatch.setattr(RayWorker, "evaluate", evaluate_and_kill)
    spec = BenchSpec(root=str(PROBLEMS), candidates=str(CANDIDATES), trials=1, baselines=False)
    store = tmp_path / "killed.sqlite"
    session = Session(ray="auto", cpu_workers=2, store=str(store), out=str(tmp_path / "killed"),
                      cache_dir=str(cache), ray_init={"num_cpus": 2, "include_dashboard": False})
    outcome = run_bench(spec, session)
    assert killed and outcome.resubmitted == 1
    assert outcome.evaluations == EXPECTED_EVALUATIONS and outcome.reused == 1
    check_metrics(outcome.metrics)
    log, attempts = _counts(store)
    assert log == EXPECTED_EVALUATIONS  # performed once each: nothing counted twice
    assert len(attempts) == 7 and len(set(attempts)) == 7  # one attempt per candidate file: nothing lost
    assert not ray.is_initialized()

    # 3. the same command again: everything is done, nothing is evaluated or recorded again
    again = run_bench(spec, session)
    assert again.evaluations == 0 and again.skipped == 5 and again.resubmitted == 0
    assert _counts(store) == (log, attempts)
    assert _strip(again.metrics) == _strip(outcome.metrics)

    # nothing left behind: no harness of this test, no Ray started by it
    deadline = time.monotonic() + 30
    while _harness_processes(str(cache)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _harness_processes(str(cache)) == []


def test_agent_mode_on_ray_evaluates_on_the_cluster(tmp_path):
    """Agent mode: the agent loops (and model calls) stay on the driver; every evaluation they
    ask for runs on a Ray worker and is recorded in the driver's store."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'kernelagent[rl]')")
    from typer.testing import CliRunner

    from tests.fake_openai_server import FakeOpenAIServer, tool
    from tests.test_agent import GOOD
    from tests.test_bench_agent import AGENT_SUITE, ENV

    with FakeOpenAIServer() as server:
        server.add(tool("submit", {"code": GOOD}), tool("submit", {"code": GOOD}))
        args = ["bench", str(AGENT_SUITE), "--model", "openai/fake-coder", "--api-base", server.url,
                "--retry-backoff", "0.01", "--model-timeout", "30", "--mode", "tools", "--concurrency", "2",
                "--max-turns", "3", "--trials", "1", "--quick-trials", "1", "--no-baselines", "--ray", "auto",
                "--cpu-workers", "2", "--store", str(tmp_path / "bench.sqlite"), "--out", str(tmp_path / "run"),
                "--cache-dir", str(tmp_path / "cache"), "--no-live", "--json"]
        result = CliRunner().invoke(app, args, env=ENV, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "evaluating on ray:" in result.output and not ray.is_initialized()
    data = last_json(result.output)
    assert (data["metrics"]["problems"], data["metrics"]["correct"]) == (2, 2) and data["evaluations"] == 2
    with sqlite3.connect(tmp_path / "bench.sqlite") as db:
        attempts = db.execute("SELECT problem_key, sample FROM attempts ORDER BY problem_key").fetchall()
    assert attempts == [("level1/1_relu", "eval-1"), ("level1/2_relu_wide", "eval-1")]


def test_a_node_lost_mid_run_loses_only_its_evaluation(tmp_path, monkeypatch):
    """Three local Ray nodes (a head with no CPU, two workers with one CPU each): one worker
    node is removed while its evaluation runs. The evaluation runs again on the other node, and
    the store has each evaluation once."""
    pytest.importorskip("ray", reason="ray is not installed (pip install 'kernelagent[rl]')")
    from ray.cluster_utils import Cluster

    from kernelagent.bench import BenchSpec, Session, run_bench
    from kernelagent.bench.ray_pool import RayWorker

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
        cluster.wait_for_nodes()
        removed: list[str] = []
        evaluate = RayWorker.evaluate

        def evaluate_and_lose_the_node(self, problem, source, config):
            if not removed:
                removed.append(self.slot.node_id)
                node = next(n for n in nodes if n.node_id == self.slot.node_id)
                threading.Timer(0.05, cluster.remove_node, (node,)).start()
            return evaluate(self, problem, source, config)

        monkeypatch.setattr(RayWorker, "evaluate", evaluate_and_lose_the_node)
        store = tmp_path / "nodes.sqlite"
        outcome = run_bench(BenchSpec(root=str(PROBLEMS), candidates=str(CANDIDATES), trials=1, baselines=False),
                            Session(ray=cluster.address, cpu_workers=1, store=str(store), out=str(tmp_path / "run"),
                                    cache_dir=str(tmp_path / "cache")))
        assert removed and outcome.resubmitted == 1
        assert outcome.evaluations == EXPECTED_EVALUATIONS and outcome.reused == 1
        check_metrics(outcome.metrics)
        log, attempts = _counts(store)
        assert log == EXPECTED_EVALUATIONS and len(attempts) == 7 and len(set(attempts)) == 7
    finally:
        cluster.shutdown()
