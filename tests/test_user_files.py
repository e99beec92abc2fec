"""Issue 56: nothing a user had is lost, and every command we print works as printed.

At the CLI, as a user meets it: a failed command leaves the user's earlier files as they were
(outputs are checked first and written whole under a temporary name), a failure of the user's
own files (store, output path) is one line and exit 2 before anything is recorded, and a
command the CLI prints runs as printed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelagent.cli import app
from kernelagent.rl.sft import stats_path_for
from tests.rl_fixtures.common import FIXTURE_RUNS
from tests.test_cli_errors import ENV, check_one_line


def run(args: list[str]):
    return CliRunner().invoke(app, [str(a) for a in args], env=ENV)


def earlier_outputs(folder: Path) -> dict[Path, str]:
    """What an earlier, successful run of each writer left in `folder`."""
    texts = {folder / "prompts.jsonl": '{"prompt": "earlier"}\n',
             folder / "prompts.train.jsonl": '{"prompt": "earlier train"}\n',
             folder / "prompts.test.jsonl": '{"prompt": "earlier test"}\n',
             folder / "sft.jsonl": '{"messages": "earlier"}\n',
             folder / "sft.stats.json": '{"rows": 1}\n',
             folder / "nodes.jsonl": '{"node": "earlier"}\n'}
    for path, text in texts.items():
        path.write_text(text)
    return texts


# (args with {empty} and {out}, exit code, a piece of the one stderr line)
FAILED_WRITES = [
    (["dataset", "prompts", "{empty}", "--out", "{out}/prompts.jsonl", "--no-inputs"], 2, "no problem files under"),
    (["export", "sft", "{empty}", "--out", "{out}/sft.jsonl"], 2, "no run folders"),
    (["export", "sft", FIXTURE_RUNS, "--out", "{out}/sft.jsonl"], 1, "no row to export"),
    (["dataset", "nodes", "{empty}", "--out", "{out}/nodes.jsonl"], 2, "no search runs found"),
    (["dataset", "prompts", "{empty}", "--out", "{out}", "--no-inputs"], 2, "is a folder, not a file"),
]


@pytest.mark.parametrize("args,code,piece", FAILED_WRITES, ids=[" ".join(map(str, a[:2])) + f" {c}" for a, c, _p in FAILED_WRITES])
def test_a_failed_command_leaves_earlier_outputs_as_they_were(tmp_path, args, code, piece):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    before = earlier_outputs(out)
    result = run([str(a).format(empty=empty, out=out) for a in args])
    check_one_line(result.exit_code, result.stdout, result.stderr, code, piece)
    assert {p: p.read_text() for p in before} == before
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in before)  # nothing new, no temporary


def test_export_sft_of_cpu_runs_writes_nothing_and_says_why(tmp_path):
    out = tmp_path / "sft.jsonl"
    result = run(["export", "sft", FIXTURE_RUNS, "--out", out])
    check_one_line(result.exit_code, result.stdout, result.stderr, 1, "--include-unmeasured")
    assert not out.exists() and not stats_path_for(out).exists() and list(tmp_path.iterdir()) == []


def test_a_successful_export_replaces_the_earlier_one_whole(tmp_path):
    out = tmp_path / "sft.jsonl"
    earlier_outputs(tmp_path)
    result = run(["export", "sft", FIXTURE_RUNS, "--out", out, "--min-speedup", "0"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all("messages" in r and r["messages"] != "earlier" for r in rows)
    assert json.loads(stats_path_for(out).read_text())["rows"] == len(rows)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~current_umask())


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# -- bench: the run's folder (items 2 and 6) --------------------------------------------------
SUITE = Path(__file__).resolve().parent / "bench_suite"


def bench(store: Path, *extra) -> list:
    """A quick candidates-mode bench (one problem, no timing) over `store`."""
    return ["bench", SUITE / "problems", "--candidates", SUITE / "candidates", "--filter", "2_add_one",
            "--trials", "1", "--no-timing", "--no-baselines", "--gpus", "cpu", "--no-live", "--store", store, *extra]


def stored_runs(store: Path) -> list[tuple[str, str, str]]:
    import sqlite3

    if not store.exists():
        return []
    with sqlite3.connect(store) as db:
        try:
            return db.execute("SELECT id, status, out_dir FROM runs").fetchall()
        except sqlite3.OperationalError:
            return []


def test_bench_out_a_file_is_one_line_before_anything_is_recorded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERNELAGENT_CACHE_DIR", str(tmp_path / "cache"))
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    store = tmp_path / "bench.sqlite"
    result = run(bench(store, "--out", a_file))
    check_one_line(result.exit_code, result.stdout, result.stderr, 2, "is a file, not a folder")
    assert stored_runs(store) == [] and a_file.read_text() == "mine\n"
    # the same command without --out is the run's first session (nothing stuck)
    ok = run(bench(store))
    assert ok.exit_code == 0, ok.output
    [(run_id, status, out)] = stored_runs(store)
    assert status == "finished" and out == str((tmp_path / "runs" / "bench" / run_id).resolve())


def test_bench_run_stuck_on_a_file_by_an_older_version_is_recoverable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERNELAGENT_CACHE_DIR", str(tmp_path / "cache"))
    store, first = tmp_path / "bench.sqlite", tmp_path / "first"
    assert run(bench(store, "--out", first)).exit_code == 0
    [(run_id, _status, _out)] = stored_runs(store)
    # What an older version left: the run recorded with a file as its folder, status running.
    import shutil
    import sqlite3

    shutil.rmtree(first)
    first.write_text("a file now\n")
    with sqlite3.connect(store) as db:
        db.execute("UPDATE runs SET status = 'running'")
    for args in (bench(store), ["bench", "--resume", run_id, "--store", store]):
        result = run(args)
        check_one_line(result.exit_code, result.stdout, result.stderr, 2, "give --out DIR")
        assert "(recorded in the store) is a file, not a folder" in result.stderr
    moved = tmp_path / "moved"
    again = run(["bench", "--resume", run_id, "--store", store, "--out", moved])
    assert again.exit_code == 0, again.output
    assert stored_runs(store) == [(run_id, "finished", str(moved.resolve()))] and (moved / "report.html").exists()
    plain = run(bench(store))  # the same command, no --out: the folder the store now records
    assert plain.exit_code == 0 and f"report: {moved.resolve() / 'report.html'}" in plain.stdout.replace("\n", "")


def test_bench_out_holding_another_runs_report_is_refused_unless_force(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERNELAGENT_CACHE_DIR", str(tmp_path / "cache"))
    mine, theirs, third = tmp_path / "a.sqlite", tmp_path / "b.sqlite", tmp_path / "c.sqlite"
    # the same settings over two stores, no --out: never one default folder
    assert run(bench(mine)).exit_code == 0 and run(bench(theirs)).exit_code == 0
    [(_a, _s, shared)], [(_b, _t, other)] = stored_runs(mine), stored_runs(theirs)
    assert shared != other
    assert json.loads((Path(shared) / "run.json").read_text())["store"] == str(mine.resolve())
    assert json.loads((Path(other) / "run.json").read_text())["store"] == str(theirs.resolve())
    # --out naming a folder that holds another run's report: refused, as optimize refuses it
    before = {name: (Path(shared) / name).read_text() for name in ("run.json", "summary.json", "report.html")}
    refused = run(bench(third, "--out", shared))
    check_one_line(refused.exit_code, refused.stdout, refused.stderr, 2, "already holds bench run")
    assert "--force" in refused.stderr and stored_runs(third) == []
    assert {name: (Path(shared) / name).read_text() for name in before} == before
    forced = run(bench(third, "--out", shared, "--force"))
    assert forced.exit_code == 0, forced.output
    assert json.loads((Path(shared) / "run.json").read_text())["store"] == str(third.resolve())


# -- a resume reuses the run's model, API base and budget (item 3) ---------------------------
def test_the_printed_resume_command_runs_as_printed_with_the_runs_own_model_and_budget(tmp_path, monkeypatch):
    from tests.fake_openai_server import FakeOpenAIServer, text
    from tests.test_search_cli import GOOD, PROBLEM, WRONG, block

    monkeypatch.setenv("KERNELAGENT_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "run"
    secret = "sk-never-stored-0123456789"
    with FakeOpenAIServer() as server:
        server.add(text(block(WRONG)), text(block(WRONG.replace("0.01", "0.02"))))
        first = run(["optimize", PROBLEM, "--model", "openai/fake-coder", "--api-base", server.url, "--api-key", secret,
                     "--strategy", "best-of-n", "--samples", "2", "--max-turns", "2", "--device", "cpu",
                     "--out", out, "--no-live"])
        assert first.exit_code == 1, first.output
        # The command the CLI prints after Ctrl-C, as printed: no --model, no budget flag.
        printed = run(["optimize", PROBLEM, "--resume", out, "--device", "cpu", "--no-live"])
        assert printed.exit_code == 1, printed.output  # the run's 2 turns are spent: no call bought
        assert len(server.requests) == 2
        assert (f"resuming with the run's own --model openai/fake-coder --api-base {server.url} --max-turns 2"
                in printed.stderr)
        # a budget flag given is the new total, the rest is still the run's
        server.add(text(block(GOOD)), text(block(WRONG)))
        more = run(["optimize", PROBLEM, "--resume", out, "--max-turns", "4", "--device", "cpu", "--no-live"])
        assert more.exit_code == 0, more.output
        assert len(server.requests) == 4 and "--max-turns" not in more.stderr.splitlines()[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["turns"] == 4 and summary["model"] == "openai/fake-coder"
    written = "".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())
    assert secret not in written  # the key is never stored


def test_a_whole_model_resume_reuses_the_runs_model_and_budget(tmp_path):
    """A whole-model run's summary names its model string, API base and budget: the printed
    `--whole-model --resume OUT` needs no --model (here the recorded server is closed, so the
    reuse shows as the server it tries to reach)."""
    from tests.test_cli_errors import closed_port
    from tests.test_wholemodel_cli import TINY

    from kernelagent.problem import load_problem

    out = tmp_path / "run"
    out.mkdir()
    base = f"http://127.0.0.1:{closed_port()}/v1"
    (out / "summary.json").write_text(json.dumps({
        "format_version": 2, "kind": "whole_model", "outcome": "interrupted", "problem": str(TINY),
        "problem_sha256": load_problem(TINY).sha256, "model": "openai/fake",
        "model_info": {"spec": "openai/fake", "api_base": base, "temperature": None},
        "settings": {"top": 2, "min_share": 0.01, "trials": 1, "strategy": "single", "samples": 1, "mode": "text",
                     "target_speedup": 1.0, "device": "cpu"},
        "budget": {"turns": 1, "max_turns": 6, "max_tokens": None, "max_cost_usd": None, "timeout_s": None},
        "regions": []}))
    result = run(["optimize", TINY, "--whole-model", "--resume", out, "--device", "cpu", "--no-live"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[0] == f"resuming with the run's own --model openai/fake --api-base {base} --max-turns 6 " \
                       "(a flag given here overrides it)"
    assert lines[-1].startswith(f"error: cannot reach the model server at {base}")


# -- a damaged store, another program's database (item 4) ------------------------------------
def damaged_store(path: Path) -> str:
    """A store with a run and enough rows to span many pages, then 8 KiB of garbage written into
    its middle (as a disk or a copy gone wrong leaves it). Returns the run id."""
    import sqlite3

    from kernelagent.bench.store import Store

    with Store(path) as store:
        store.open_run("r1", "candidates", {"root": str(SUITE / "problems"), "candidates": str(SUITE / "candidates"),
                                            "filter": "2_add_one", "trials": 1, "timing": False, "baselines": False},
                       str(path.parent / "r1"))
        for i in range(300):
            store.record_evaluation(f"k{i}", {"status": "correct", "pad": "x" * 2000}, settings={}, fingerprint={},
                                    run_id="r1")
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\xff" * 8192)
    return "r1"


@pytest.mark.parametrize("checked_at_open", [True, False], ids=["checked at open", "found in use"])
@pytest.mark.parametrize("command", ["bench", "report"])
def test_a_damaged_store_is_one_line_and_exit_2(tmp_path, monkeypatch, command, checked_at_open):
    monkeypatch.chdir(tmp_path)
    if not checked_at_open:  # a store too large to read through at open: the damage is met in use
        monkeypatch.setattr("kernelagent.bench.store.QUICK_CHECK_MAX_BYTES", 0, raising=False)
    store = tmp_path / "bench.sqlite"
    run_id = damaged_store(store)
    args = (["bench", "--resume", run_id, "--store", store] if command == "bench"
            else ["report", run_id, "--store", store])
    result = run(args)
    if checked_at_open:
        check_one_line(result.exit_code, result.stdout, result.stderr, 2, "damaged")
    else:  # bench's progress lines come first: the run started before a page was found damaged
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert result.stderr.strip().splitlines()[-1].startswith(f"error: the store {store} is damaged")
    assert "move it aside" in result.stderr and "\ufffd" not in result.stderr


@pytest.mark.parametrize("command", ["bench", "report --list"])
def test_another_programs_database_is_refused_and_left_as_it_was(tmp_path, monkeypatch, command):
    import sqlite3

    monkeypatch.chdir(tmp_path)
    theirs = tmp_path / "app.db"
    with sqlite3.connect(theirs) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("INSERT INTO users (name) VALUES ('ada')")
    db.close()
    before = theirs.read_bytes()
    args = (bench(theirs) if command == "bench" else ["report", "--list", "--store", theirs])
    result = run(args)
    check_one_line(result.exit_code, result.stdout, result.stderr, 2, "not a kernelagent store (its tables: users)")
    assert theirs.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


# -- verify: every output checked before the run (item 8) -------------------------------------
@pytest.mark.parametrize("target", ["/proc/kernelagent-nowhere/verify.xml", "/proc/verify.xml"])
def test_verify_junit_where_nothing_can_be_written_says_so_first(tmp_path, monkeypatch, target):
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(Path(__file__).resolve().parent / "ci_repo", repo)
    monkeypatch.setenv("KERNELAGENT_CACHE_DIR", str(tmp_path / "cache"))
    result = run(["verify", repo, "--junit", target])
    check_one_line(result.exit_code, result.stdout, result.stderr, 2, f"--junit {target}: cannot write in /proc")
    assert result.stdout == "" and not (repo / "kernelagent.lock.json").exists()
    assert not (tmp_path / "cache" / "bench.sqlite").exists()  # nothing was evaluated


# -- smaller ones (item 9) --------------------------------------------------------------------
def test_usage_lines_name_a_repeated_argument_once():
    from tests.test_cli_errors import commands

    for path, _cmd in commands():
        usage = run([*path, "--help"]).stdout.splitlines()[0]
        assert "...." not in usage, usage


def test_eval_into_a_closed_pipe_exits_with_the_verdict(tmp_path):
    """`kernelagent eval P C | head -1` under `set -o pipefail`: the pass is exit 0. The pipe's
    reader is gone before the first line, so every write meets the closed pipe."""
    import subprocess
    import sys

    from tests.conftest import CANDIDATES

    script = Path(sys.executable).parent / "kernelagent"
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([str(script), "eval", str(CANDIDATES / "relu_problem.py"), str(CANDIDATES / "relu_good.py"),
                               "--no-baselines", "--no-timing"], stdout=write, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "KERNELAGENT_CACHE_DIR": str(tmp_path / "cache"),
                                   "CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert "BrokenPipe" not in proc.stderr and "Exception ignored" not in proc.stderr and "error" not in proc.stderr


def test_eval_in_a_pipe_prints_no_padding_and_its_stage_seconds_only_with_v(tmp_path, monkeypatch):
    from tests.conftest import CANDIDATES

    monkeypatch.setenv("KERNELAGENT_CACHE_DIR", str(tmp_path / "cache"))
    args = ["eval", CANDIDATES / "relu_problem.py", CANDIDATES / "relu_good.py", "--no-baselines", "--no-timing"]
    plain, verbose = run(args), run([*args, "-v"])
    assert plain.exit_code == verbose.exit_code == 0, plain.output + verbose.output
    lines = plain.stdout.splitlines()
    assert lines[0] == "PASS: correct" and any(line.startswith("correct ") for line in lines)
    assert [line for line in lines if line != line.rstrip()] == []
    assert "total_server" not in plain.stdout and "total_server" in verbose.stdout
    assert [line for line in verbose.stdout.splitlines() if "total_server" in line][0].count("s  ") > 3  # one line


CACHE_DIR_COMMANDS = [
    ["eval", "{problem}", "{good}"],
    ["profile", "{problem}", "{good}"],
    ["bench", "{problems}", "--candidates", "{candidates}"],
    ["serve"],
    ["verify", "{tmp}"],
]


@pytest.mark.parametrize("args", CACHE_DIR_COMMANDS, ids=[a[0] for a in CACHE_DIR_COMMANDS])
@pytest.mark.parametrize("under", [False, True], ids=["a file", "under a file"])
def test_cache_dir_that_is_a_file_is_refused(tmp_path, args, under):
    from tests.conftest import CANDIDATES

    a_file = tmp_path / "cache.txt"
    a_file.write_text("mine\n")
    given = a_file / "sub" if under else a_file
    places = {"problem": CANDIDATES / "relu_problem.py", "good": CANDIDATES / "relu_good.py",
              "problems": SUITE / "problems", "candidates": SUITE / "candidates", "tmp": tmp_path}
    result = run([str(a).format(**places) for a in args] + ["--cache-dir", given])
    check_one_line(result.exit_code, result.stdout, result.stderr, 2, "is a file, not a folder")
    assert "--cache-dir" in result.stderr and a_file.read_text() == "mine\n"


def test_regions_without_whole_model_is_refused(tmp_path):
    from tests.conftest import CANDIDATES

    result = run(["optimize", CANDIDATES / "relu_problem.py", "--regions", "2", "--model",
                  f"scripted:{CANDIDATES / 'relu_good.py'}", "--out", tmp_path / "run"])
    check_one_line(result.exit_code, result.stdout, result.stderr, 2, "--regions is for --whole-model")
    assert not (tmp_path / "run").exists()


def test_plan_out_a_folder_of_other_files_is_refused_and_a_plans_own_is_planned_again(tmp_path, monkeypatch):
    import kernelagent.wholemodel.plan as plan_module
    from tests.test_wholemodel_cli import TINY

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    refused = run(["plan", TINY, "--device", "cpu", "--out", mine])
    check_one_line(refused.exit_code, refused.stdout, refused.stderr, 2, "is not empty and holds no plan (notes.txt)")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]

    def fake(problem, out, device="cpu", **kw):
        return {"device": "cpu", "regions": [], "totals": {"nodes_us": 1.0, "model_forward_us": 1.0,
                                                           "nodes_vs_model": 1.0, "clock": "CPU time"}}

    monkeypatch.setattr(plan_module, "make_plan", fake)
    earlier = tmp_path / "plan"
    (earlier / "regions").mkdir(parents=True)
    (earlier / "plan.json").write_text("{}")
    assert run(["plan", TINY, "--device", "cpu", "--out", earlier]).exit_code == 0


def test_scripted_models_are_named_wherever_a_model_is_asked_for(tmp_path):
    from tests.conftest import CANDIDATES
    from tests.test_cli_errors import unwrap

    for path in (["bench"], ["regenerate"], ["optimize"]):
        assert "scripted:FILE" in unwrap(run([*path, "--help"]).stdout), path
    missing = run(["optimize", CANDIDATES / "relu_problem.py", "--out", tmp_path / "run"])
    check_one_line(missing.exit_code, missing.stdout, missing.stderr, 2, "no model given")
    assert "scripted:FILE" in missing.stderr


def test_a_resume_of_another_problems_run_names_that_problem(tmp_path):
    from tests.test_wholemodel_cli import MODEL, TINY

    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({
        "kind": "whole_model", "problem": "/somewhere/level1/1_relu.py", "problem_sha256": "0" * 64,
        "settings": {"top": 3}}))
    result = run(["optimize", TINY, "--whole-model", "--model", MODEL, "--resume", out, "--device", "cpu"])
    check_one_line(result.exit_code, result.stdout, result.stderr, 2,
                   "the run was for /somewhere/level1/1_relu.py, not tiny.py")
    assert "another version" not in result.stderr


def test_readme_and_getting_started_run_the_tests_the_same_way():
    from tests.conftest import REPO

    def command(path: Path) -> list[str]:
        return [line.strip() for line in path.read_text().splitlines() if "pip install -e" in line and "pytest" in line]

    readme, started = command(REPO / "README.md"), command(REPO / "docs" / "getting-started.md")
    assert readme and readme == started


def test_the_docs_site_build_is_ignored_by_git():
    import subprocess

    from tests.conftest import REPO

    proc = subprocess.run(["git", "check-ignore", "-q", "site/index.html"], cwd=REPO, capture_output=True, timeout=30)
    if proc.returncode == 128:
        pytest.skip("not a git checkout")
    assert proc.returncode == 0


def test_eval_json_names_the_option_and_says_it_is_one_result_per_candidate(tmp_path, monkeypatch):
    from tests.conftest import CANDIDATES
    from tests.test_cli_errors import unwrap

    monkeypatch.setenv("KERNELAGENT_CACHE_DIR", str(tmp_path / "cache"))
    good = CANDIDATES / "relu_good.py"
    result = run(["eval", CANDIDATES / "relu_problem.py", good, good, "--json", "--trials", "1", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    messages = [flag["message"] for row in rows for flag in row["flags"]]
    messages += [str(v) for row in rows for v in ((row.get("baselines") or {}).get("skipped") or {}).values()]
    assert len(rows) == 2 and messages
    # what the model (trajectory.json) and a script read names the option, not an EvalConfig field
    assert not [m for m in messages if "compile_baseline_on_cpu" in m]
    assert [m for m in messages if "--compile-baseline-on-cpu" in m]
    assert "JSON result per candidate, one per line" in unwrap(run(["eval", "--help"]).stdout)


def test_regenerate_takes_max_turns(tmp_path):
    import shutil

    from tests.fake_openai_server import FakeOpenAIServer, text
    from tests.test_ci import CI_REPO, WRONG_RELU
    from tests.test_ci import run as ci_run
    from tests.test_search_cli import block

    repo, cache = tmp_path / "repo", tmp_path / "cache"
    shutil.copytree(CI_REPO, repo)
    assert ci_run(["verify"], repo, cache).returncode == 0  # the lock
    (repo / "kernels" / "relu.py").write_text(WRONG_RELU)
    with FakeOpenAIServer() as server:
        server.add(text(block(WRONG_RELU.replace("0.01 * x", "0.02 * x"))), text(block(WRONG_RELU)))
        failed = ci_run(["regenerate", "--out", str(tmp_path / "regen"), "--api-base", server.url, "--max-turns", "1"],
                        repo, cache)
        calls = len(server.requests)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert calls == 1  # the manifest's budget is 2 turns: --max-turns 1 overrides it


def test_pass_at_k_over_different_problems_says_so_on_the_page():
    from kernelagent.bench.report import _pass_table

    uneven = {"max_samples": 2, "pass_at_k": {"1": {"value": 0.75, "problems": 4}, "2": {"value": 0.5, "problems": 2}}}
    even = {"max_samples": 2, "pass_at_k": {"1": {"value": 0.5, "problems": 2}, "2": {"value": 0.75, "problems": 2}}}
    assert "at least k samples" in _pass_table(uneven) and "at least k samples" not in _pass_table(even)


def test_report_out_a_file_is_one_line(tmp_path):
    from kernelagent.bench.store import Store

    store = tmp_path / "bench.sqlite"
    with Store(store) as db:
        db.open_run("r1", "candidates", {"root": str(SUITE / "problems")}, str(tmp_path / "r1"))
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    result = run(["report", "r1", "--store", store, "--out", a_file])
    check_one_line(result.exit_code, result.stdout, result.stderr, 2, "is a file, not a folder")
    assert a_file.read_text() == "mine\n"


def test_plan_shows_a_region_of_the_whole_forward_as_unbounded_not_zero(tmp_path, monkeypatch):
    import kernelagent.wholemodel.plan as plan_module
    from tests.test_wholemodel_cli import TINY

    def fake(problem, out, device="cpu", **kw):
        region = {"id": "region_0", "kind": "elementwise", "ops": ["aten::relu"], "share": 1.0, "time_us": 23.0,
                  "amdahl_bound": None, "shape": [4], "dtype": "float32", "fusable": True, "extractable": True,
                  "why_not": ""}
        return {"device": "cpu", "regions": [region], "totals": {"nodes_us": 23.0, "model_forward_us": 23.0,
                                                                 "nodes_vs_model": 1.0, "clock": "CPU time"}}

    monkeypatch.setattr(plan_module, "make_plan", fake)
    result = run(["plan", TINY, "--device", "cpu", "--out", tmp_path / "plan"])
    assert result.exit_code == 0, result.output
    row = [line for line in result.stdout.splitlines() if line.startswith("region_0")][0]
    assert "unbound" in row and "0.00x" not in row
