"""`kernelagent bench --candidates` end to end on the CPU, with the real harness: exact
metrics over a suite of correct, wrong, crashing, rejected, non-compiling and missing
candidates; a batch killed with SIGKILL midway and resumed, with no evaluation repeated; a
second run that evaluates nothing; a new run and a changed candidate that reuse the store."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelagent.cli import app
from tests.conftest import TESTS

SUITE = TESTS / "bench_suite"
PROBLEMS = SUITE / "problems"
CANDIDATES = SUITE / "candidates"
EXPECTED_EVALUATIONS = 6  # 7 candidate files; d_good_copy.py is a_good.py byte for byte


def bench_args(paths: dict, *extra: str, candidates: Path = CANDIDATES) -> list[str]:
    return ["bench", str(PROBLEMS), "--candidates", str(candidates), "--trials", "2", "--store", str(paths["store"]),
            "--out", str(paths["out"]), "--cache-dir", str(paths["cache"]), "--gpus", "cpu", "--no-live", *extra]


def invoke(args: list[str]):
    return CliRunner().invoke(app, args, env={"COLUMNS": "120", "TERM": "dumb"}, catch_exceptions=False)


def log_rows(store: Path) -> list[tuple[str, str]]:
    if not store.exists():
        return []
    with sqlite3.connect(store, timeout=30) as db:
        try:
            return db.execute("SELECT key, run_id FROM evaluation_log ORDER BY id").fetchall()
        except sqlite3.OperationalError:  # the schema is not there yet
            return []


def last_json(output: str) -> dict:
    return json.loads([line for line in output.splitlines() if line.startswith("{")][-1])


@pytest.fixture
def paths(tmp_path) -> dict:
    return {"store": tmp_path / "bench.sqlite", "out": tmp_path / "run", "cache": tmp_path / "cache"}


def check_metrics(m: dict) -> None:
    """The suite's exact numbers (CPU: no timing is meaningful, so no speedups, fast_p 0)."""
    assert m["problems"] == 5 and m["compiled"] == 3 and m["correct"] == 2
    assert m["compile_rate"] == 0.6 and m["correctness_rate"] == 0.4
    assert m["status_counts"] == {"compile_error": 1, "correct": 2, "missing": 1, "rejected": 1}
    assert m["fast_p"] == {b: {"0": 0.0, "1.0": 0.0, "1.5": 0.0, "2.0": 0.0} for b in ("eager", "inductor")}
    assert m["geomean_speedup"] == {"eager": None, "inductor": None} and not m["timings_meaningful"]
    # level1/1_relu: 4 samples, 2 correct -> pass@1 0.5, pass@4 1; 2_double 1/1; the rest 0.
    assert m["samples"] == 7 and m["max_samples"] == 4
    assert m["pass_at_k"]["1"] == {"value": pytest.approx(0.3), "problems": 5}
    assert m["pass_at_k"]["4"] == {"value": pytest.approx(0.5), "problems": 2}
    assert m["by_level"]["level1"]["correctness_rate"] == 1.0
    assert m["by_level"]["level2"]["compile_rate"] == pytest.approx(1 / 3)
    assert m["by_level"]["level2"]["correct"] == 0
    assert m["tokens"]["total"] == 0 and m["cost_usd"] == 0.0


def test_killed_batch_resumes_without_repeating_work(paths, tmp_path):
    env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(TESTS.parent)}
    cmd = [sys.executable, "-c", "from kernelagent.cli import main; main()",
           *bench_args(paths, "--cpu-workers", "1")]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while len(log_rows(paths["store"])) < 2:  # midway: after two finished evaluations
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() - started < 180, "the batch made no progress"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    before = log_rows(paths["store"])
    assert 2 <= len(before) < EXPECTED_EVALUATIONS, "the kill did not land midway"
    run_id = json.loads((paths["out"] / "run.json").read_text())["run_id"]

    # Resume by id: the rest is evaluated, nothing finished is evaluated again.
    result = invoke(bench_args(paths, "--resume", run_id, "--json"))
    assert result.exit_code == 0, result.output
    after = log_rows(paths["store"])
    assert after[: len(before)] == before  # nothing committed was lost
    keys = [key for key, _ in after]
    assert len(keys) == EXPECTED_EVALUATIONS and len(set(keys)) == len(keys)  # no evaluation repeated
    data = last_json(result.output)
    assert data["run_id"] == run_id and data["evaluations"] == EXPECTED_EVALUATIONS - len(before)
    check_metrics(data["metrics"])

    with sqlite3.connect(paths["store"]) as db:
        attempts = db.execute("SELECT problem_key, sample, reused FROM attempts WHERE run_id = ? ORDER BY id",
                              (run_id,)).fetchall()
    assert len(attempts) == 7 and len({(p, s) for p, s, _ in attempts}) == 7
    assert [(p, s) for p, s, reused in attempts if reused] == [("level1/1_relu", "d_good_copy.py")]

    summary = json.loads((paths["out"] / "summary.json").read_text())
    check_metrics(summary["metrics"])
    assert summary["run"]["status"] == "finished" and summary["run"]["sessions"] == 2
    # what the evaluations cost, over both sessions (issue 39; bench/cost.py)
    cost = summary["cost"]
    assert cost["evaluations"] == EXPECTED_EVALUATIONS and cost["evaluations_per_device_minute"] > 0
    assert cost["host_cpu_s_per_evaluation"] > 0 and cost["slot_busy_share"] is not None
    rows = {r["key"]: r for r in csv.DictReader((paths["out"] / "problems.csv").open())}
    assert {k: r["status"] for k, r in rows.items()} == {
        "level1/1_relu": "correct", "level1/2_double": "correct", "level2/1_relu_half": "rejected",
        "level2/2_add_one": "compile_error", "level2/3_negate": "missing"}
    assert rows["level1/1_relu"]["correct_samples"] == "2" and rows["level1/1_relu"]["samples"] == "4"
    assert "modified in place" in rows["level2/1_relu_half"]["reason"]
    html = (paths["out"] / "report.html").read_text()
    assert "level2/1_relu_half" in html and "not meaningful" in html

    # The same command again: everything is done, zero evaluations, no harness started.
    result = invoke(bench_args(paths, "--json"))
    assert result.exit_code == 0, result.output
    data = last_json(result.output)
    assert data["run_id"] == run_id and data["evaluations"] == 0 and data["skipped"] == 5
    check_metrics(data["metrics"])
    assert len(log_rows(paths["store"])) == EXPECTED_EVALUATIONS

    # A new run over the same store: every verdict comes from the store.
    result = invoke(bench_args({**paths, "out": tmp_path / "run2"}, "--run", "second", "--json"))
    assert result.exit_code == 0, result.output
    data = last_json(result.output)
    assert data["run_id"] == "second" and data["evaluations"] == 0 and data["reused"] == 7
    check_metrics(data["metrics"])

    # One candidate changed (a copy of the candidates folder): only that one is evaluated.
    changed = tmp_path / "candidates"
    shutil.copytree(CANDIDATES, changed)
    wrong = changed / "level1" / "1_relu" / "b_wrong.py"
    wrong.write_text(wrong.read_text().replace("0.01 * x", "0.02 * x"))
    result = invoke(bench_args({**paths, "out": tmp_path / "run3"}, "--json", candidates=changed))
    assert result.exit_code == 0, result.output
    data = last_json(result.output)
    assert data["evaluations"] == 1 and data["reused"] == 6
    check_metrics(data["metrics"])
    assert len(log_rows(paths["store"])) == EXPECTED_EVALUATIONS + 1


def test_progress_is_line_oriented_off_a_terminal(paths):
    result = invoke(bench_args(paths, "--filter", "level1/2_*"))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("bench: starting run cand-problems-")
    assert any(line.startswith("[1/1] level1/2_double: correct") and "pass 1/1" in line and "ETA" in line
               for line in lines), result.output + (paths["out"] / "problems.csv").read_text()
    assert lines[-1].startswith("report: ") and "\x1b[" not in result.output  # no redraws, no colours
    # `bench DIR --resume RUN` on this candidates run, DIR given without --candidates (issue 43: it said
    # "no model given"): the run's own settings are used; it is finished, so nothing is evaluated.
    run_id = json.loads((paths["out"] / "run.json").read_text())["run_id"]
    again = CliRunner().invoke(app, ["bench", str(PROBLEMS), "--resume", run_id, "--store", str(paths["store"]),
                                     "--no-live", "--json"], env={"KERNELAGENT_MODEL": None, "COLUMNS": "120"})
    assert again.exit_code == 0, again.output
    data = last_json(again.stdout)
    assert data["run_id"] == run_id and data["evaluations"] == 0 and data["skipped"] == 1
    elsewhere = CliRunner().invoke(app, ["bench", str(SUITE), "--resume", run_id, "--store", str(paths["store"])],
                                   env={"KERNELAGENT_MODEL": None})
    assert elsewhere.exit_code == 2 and f"--resume {run_id} is a run over {PROBLEMS}" in elsewhere.stderr


def test_bad_input_of_issue_43_is_one_line_exit_2(tmp_path):
    """An empty benchmark folder said "no model given"; --store on a file that is not a database
    was an internal error (exit 70)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(app, ["bench", str(empty), "--store", str(tmp_path / "s.sqlite")],
                                env={"KERNELAGENT_MODEL": None})
    assert result.exit_code == 2 and result.stderr.strip() == f"error: no problems found under {empty}", result.output
    notdb = tmp_path / "notes.txt"
    notdb.write_text("not a database\n" * 100)
    result = CliRunner().invoke(app, ["bench", str(PROBLEMS), "--candidates", str(CANDIDATES), "--store", str(notdb)],
                                env={"KERNELAGENT_MODEL": None})
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (f"error: --store {notdb}: cannot open it as a kernelagent store "
                                     "(file is not a database)")


def test_live_panel_renders():
    import io

    from rich.console import Console

    from kernelagent.bench.progress import BenchProgress

    buffer = io.StringIO()
    progress = BenchProgress(console=Console(file=buffer, force_terminal=True, width=120))
    with progress:
        assert progress.use_live
        progress.begin("run-x", "agent", 3, 1, 1, ["cuda:0", "cuda:1"], 2, resumed=True)
        progress.eval_started("cuda:1", "level1/2_gelu")
        progress.charge(1500, 0.02)
        progress.problem_finished("level1/3_softmax", {"correct": True, "speedup_inductor": 1.7, "samples": 1})
    text = buffer.getvalue()
    for expected in ("problems 2/3", "cuda:1", "level1/2_gelu", "level1/3_softmax 1.70x vs inductor", "$0.0200",
                     "1500", "ETA"):
        assert expected in text, expected


@pytest.mark.parametrize("args, message", [
    (["bench"], "give a benchmark directory"),
    (["bench", "no/such/dir", "--candidates", "."], "benchmark directory not found"),
    (["bench", str(PROBLEMS), "--candidates", "no/such/cdir"], "candidates directory not found"),
    (["bench", str(PROBLEMS), "--candidates", str(CANDIDATES), "--levels", "x"], "--levels"),
    (["bench", str(PROBLEMS), "--candidates", str(CANDIDATES), "--filter", "zzz*"], "no problems found"),
    (["bench", str(PROBLEMS), "--candidates", str(CANDIDATES), "--gpus", "a,b"], "--gpus"),
    (["bench", str(PROBLEMS)], "--model"),
    (["bench", "--resume", "nope"], "no run 'nope'"),
])
def test_bad_input_is_one_line_exit_2(args, message, tmp_path):
    result = CliRunner().invoke(app, [*args, "--store", str(tmp_path / "s.sqlite")],
                                env={"KERNELAGENT_MODEL": None, "COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
