"""Kernels in CI (issue 14): `kernelagent verify`, `regenerate` and `init`, run as a user
runs them, through the console script, on a copy of tests/ci_repo (three small kernels), with
the real harness on the CPU (Triton interpreter) and, for regenerate, the real litellm client
against the fake OpenAI server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import CANDIDATES, REPO, TESTS
from tests.fake_openai_server import FakeOpenAIServer, text, tool

CI_REPO = TESTS / "ci_repo"
WRONG_RELU = (CANDIDATES / "relu_wrong.py").read_text()  # a leaky ReLU: wrong on signed inputs
# A correct ReLU that differs from the repository's, so a replacement is visible.
GOOD_RELU = (CI_REPO / "kernels" / "relu.py").read_text().replace(
    "tl.maximum(x, 0.0)", "tl.where(x > 0, x, 0.0)")
assert GOOD_RELU != (CI_REPO / "kernels" / "relu.py").read_text()


def console_script() -> str:
    """The installed `kernelagent` entry point (the venv's), as a user would run it."""
    local = Path(sys.executable).parent / "kernelagent"
    found = str(local) if local.exists() else shutil.which("kernelagent")
    if not found:
        pytest.skip("the kernelagent console script is not installed")
    return found


@pytest.fixture
def repo(tmp_path) -> Path:
    target = tmp_path / "repo"
    shutil.copytree(CI_REPO, target)
    return target


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "cache"


def run(args: list[str], cwd: Path, cache: Path, **env: str | None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), "KERNELAGENT_CACHE_DIR": str(cache), "COLUMNS": "120",
            "TERM": "dumb"}
    for key in ("KERNELAGENT_MODEL", "KERNELAGENT_API_BASE", "KERNELAGENT_API_KEY", "GITHUB_STEP_SUMMARY"):
        full.pop(key, None)
    for key, value in env.items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    return subprocess.run([console_script(), *args], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=600)


def junit(path: Path) -> tuple[int, int, dict[str, str | None]]:
    """(tests, failures, {test case name: failure message or None})."""
    suite = ET.parse(path).getroot().find("testsuite")
    cases = {}
    for case in suite.findall("testcase"):
        failure = case.find("failure")
        cases[case.get("name")] = None if failure is None else failure.get("message")
    return int(suite.get("tests")), int(suite.get("failures")), cases


def evaluations(cache: Path) -> int:
    """Evaluations the harness performed, as the bench store records them (a store hit adds none)."""
    with sqlite3.connect(cache / "bench.sqlite") as db:
        return db.execute("SELECT COUNT(*) FROM evaluation_log").fetchone()[0]


def lock(repo: Path) -> dict:
    return json.loads((repo / "kernelagent.lock.json").read_text())["kernels"]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def block(code: str) -> str:
    return f"Here is my kernel.\n\n```python\n{code}```\n"


@pytest.mark.slow
def test_verify_pass_change_wrong_kernel_and_cache(repo, cache, tmp_path):
    # 1. Three kernels pass; the JUnit has 3 tests and 0 failures; the lock records all three.
    first = run(["verify", "--junit", str(tmp_path / "j1.xml")], repo, cache)
    assert first.returncode == 0, first.stdout + first.stderr
    assert junit(tmp_path / "j1.xml") == (3, 0, {"relu": None, "scale": None, "add": None})
    assert "speed not checked (no GPU" in first.stdout and "Traceback" not in first.stderr
    locked = lock(repo)
    assert sorted(locked) == ["add", "relu", "scale"]
    assert locked["relu"]["kernel_sha256"] == sha((repo / "kernels/relu.py").read_text())
    assert locked["relu"]["verdict"] == "correct" and locked["relu"]["speed_checked"] is False
    lock_text = (repo / "kernelagent.lock.json").read_text()
    assert json.dumps(json.loads(lock_text), indent=2, sort_keys=True) + "\n" == lock_text  # sorted, stable
    performed = evaluations(cache)
    assert performed == 3

    # 6. Nothing changed: no evaluation at all (the store answers), the lock is left as it was.
    second = run(["verify", str(repo / "kernelagent.toml"), "--json"], tmp_path, cache)
    assert second.returncode == 0, second.stdout + second.stderr
    report = json.loads(second.stdout)
    assert report["evaluated"] == 0 and report["reused"] == 3 and report["speed_checked"] is False
    assert evaluations(cache) == performed
    assert (repo / "kernelagent.lock.json").read_text() == lock_text

    # 2. One problem changes (its kernel is still correct): exit 1, the JUnit names that kernel
    # and says its problem changed; the step summary gets a table.
    problem = repo / "problems/scale.py"
    problem.write_text(problem.read_text().replace("torch.randn(64, 4096)]", "torch.randn(32, 4096)]"))
    summary = tmp_path / "step_summary.md"
    changed = run(["verify", "--junit", str(tmp_path / "j2.xml")], repo, cache, GITHUB_STEP_SUMMARY=str(summary))
    assert changed.returncode == 1, changed.stdout + changed.stderr
    tests, failures, cases = junit(tmp_path / "j2.xml")
    assert (tests, failures) == (3, 1) and cases["relu"] is None and cases["add"] is None
    assert "problem changed since the lock" in cases["scale"] and "problems/scale.py" in cases["scale"]
    table = summary.read_text()
    assert "| kernel | result | verdict | speedup | details |" in table
    assert "| `scale` | ❌ fail | correct |" in table and "| `relu` | ✅ pass |" in table
    assert evaluations(cache) == performed + 1  # only the changed problem's kernel

    # 3. A wrong kernel swapped in: that kernel fails, with the first mismatch.
    (repo / "kernels/relu.py").write_text(WRONG_RELU)
    wrong = run(["verify", "--junit", str(tmp_path / "j3.xml"), "--json"], repo, cache)
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    _, failures, cases = junit(tmp_path / "j3.xml")
    assert failures == 2 and cases["add"] is None
    assert cases["relu"].startswith("incorrect") and "first at [" in cases["relu"] and "expected" in cases["relu"]
    by_name = {k["name"]: k for k in json.loads(wrong.stdout)["kernels"]}
    assert by_name["relu"]["status"] == "fail" and by_name["relu"]["verdict"] == "incorrect"
    assert by_name["relu"]["kernel_changed"] is True and not by_name["relu"]["problem_changed"]
    assert "FAIL  relu: incorrect" in wrong.stderr  # the per-kernel lines go to stderr with --json
    assert lock(repo)["relu"]["kernel_sha256"] != sha(WRONG_RELU)  # plain verify does not relock

    # --update-lock records this run (the exit code still judges against the old lock).
    relock = run(["verify", "--update-lock"], repo, cache)
    assert relock.returncode == 1
    assert lock(repo)["scale"]["problem_sha256"] == sha(problem.read_text())
    assert lock(repo)["relu"]["verdict"] == "incorrect"
    assert evaluations(cache) == performed + 2  # every result of this run came from the store


@pytest.mark.slow
def test_regenerate_keeps_file_on_wrong_answers_and_replaces_with_a_correct_one(repo, cache, tmp_path):
    assert run(["verify"], repo, cache).returncode == 0  # the lock
    kernel = repo / "kernels/relu.py"
    kernel.write_text(WRONG_RELU)
    wrong_bytes = kernel.read_bytes()

    dry = run(["regenerate", "--dry-run"], repo, cache)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "would regenerate relu: incorrect" in dry.stdout
    assert "scale" not in dry.stdout and "add" not in dry.stdout

    with FakeOpenAIServer() as server:
        # 5. A model that only answers wrong kernels: the file is untouched, exit 1.
        server.add(text(block(WRONG_RELU.replace("0.01 * x", "0.02 * x"))), text(block(WRONG_RELU)))
        out = tmp_path / "regen1"
        failed = run(["regenerate", "--out", str(out), "--api-base", server.url, "--retry-backoff", "0.01"],
                     repo, cache)
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert kernel.read_bytes() == wrong_bytes
        assert "relu: failed" in failed.stdout
        assert len(server.requests) == 2  # the manifest's budget: max_turns = 2
        assert server.requests[0]["model"] == "fake-coder"  # the manifest's model
        # The agent started from the current kernel: it is in the task, and its verdict is step 0.
        task = server.requests[0]["messages"][1]["content"]
        assert "## Current kernel" in task and "leaky_kernel" in task
        trajectory = json.loads((out / "relu" / "trajectory.json").read_text())
        assert trajectory["steps"][0]["initial"] and trajectory["steps"][0]["observations"][0]["verdict"] == "incorrect"
        assert json.loads((out / "relu" / "summary.json").read_text())["outcome"] == "no_correct_kernel"
        assert not (out / "scale").exists()  # only failing kernels are regenerated

        # 4. A model that answers a correct kernel: it replaces the wrong one, exit 0 ...
        server.add(tool("submit", {"code": GOOD_RELU}))
        out = tmp_path / "regen2"
        fixed = run(["regenerate", "--out", str(out), "--api-base", server.url, "--json"], repo, cache)
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        assert kernel.read_text() == GOOD_RELU
        report = json.loads(fixed.stdout)
        assert [(k["name"], k["outcome"]) for k in report["kernels"]] == [("relu", "replaced")]
        assert lock(repo)["relu"]["kernel_sha256"] == sha(GOOD_RELU)
        assert (out / "relu" / "summary.json").is_file()

    # ... and verify passes again, from the store.
    before = evaluations(cache)
    again = run(["verify", "--junit", str(tmp_path / "j.xml")], repo, cache)
    assert again.returncode == 0, again.stdout + again.stderr
    assert junit(tmp_path / "j.xml")[:2] == (3, 0)
    assert evaluations(cache) == before


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize("manifest,expected", [
    (None, "no manifest at"),
    ("[[kernel]]\nproblem = 'problems/relu.py'\n", "`kernel` is missing"),
    ("[[kernel]]\nproblem = 'problems/relu.py'\nkernel = 'kernels/nope.py'\n", "kernels/nope.py not found"),
    ("[[kernel]]\nproblem = 'problems/relu.py'\nkernel = 'kernels/relu.py'\nspeed = 2\n", "unknown key `speed`"),
    ("[[kernel]]\nproblem = 'problems/relu.py'\nkernel = 'kernels/relu.py'\ntarget_speedup = 'fast'\n",
     "`target_speedup` must be a number"),
    ("[[kernel]]\nproblem = 'problems/relu.py'\nkernel = 'kernels/relu.py'\n"
     "[[kernel]]\nproblem = 'problems/add.py'\nkernel = 'kernels/relu.py'\n", "already used"),
    ("kernel = [\n", "not valid TOML"),
])
@pytest.mark.parametrize("command", ["verify", "regenerate"])
def test_bad_manifest_is_one_line_exit_2(repo, cache, manifest, expected, command):
    path = repo / "kernelagent.toml"
    if manifest is None:
        path.unlink()
    else:
        path.write_text(manifest)
    proc = run([command, "--dry-run"] if command == "regenerate" else [command], repo, cache)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in one_error_line(proc)


def test_verify_finds_bad_input_before_it_says_or_writes_anything(repo, cache, tmp_path):
    """Issue 43: verify printed its plan on stdout before an error, and wrote the lock before failing
    to write --junit. Bad input is now found first: one line on stderr, exit 2, nothing else."""
    lock = repo / "kernelagent.lock.json"
    unknown = run(["verify", "--only", "nope"], repo, cache)
    assert unknown.returncode == 2 and unknown.stdout == "", unknown.stdout + unknown.stderr
    assert "no kernel named nope" in one_error_line(unknown)
    blocker = tmp_path / "reports"
    blocker.write_text("a file where a folder should be")
    junit_out = run(["verify", "--junit", str(blocker / "verify.xml")], repo, cache)
    assert junit_out.returncode == 2 and junit_out.stdout == "", junit_out.stdout + junit_out.stderr
    assert one_error_line(junit_out) == f"error: --junit {blocker / 'verify.xml'}: {blocker} is a file, not a folder"
    assert not lock.exists() and not (cache / "bench.sqlite").exists()  # nothing was evaluated or written


def test_regenerate_without_a_model_is_exit_2(repo, cache):
    text_ = (repo / "kernelagent.toml").read_text().replace('model = "openai/fake-coder"\n', "")
    (repo / "kernelagent.toml").write_text(text_)
    proc = run(["regenerate"], repo, cache)
    assert proc.returncode == 2
    assert "KERNELAGENT_MODEL" in one_error_line(proc)
    assert not (cache / "bench.sqlite").exists()  # it stopped before any evaluation


def test_minimal_manifest_and_init_from_folders(repo, cache):
    """`init` pairs problems with kernels by name; the issue's minimal manifest parses as it is."""
    from kernelagent.ci.manifest import load_manifest

    (repo / "kernelagent.toml").unlink()
    (repo / "problems" / "orphan.py").write_text((repo / "problems/relu.py").read_text())
    proc = run(["init"], repo, cache)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped orphan.py: no kernel orphan.py" in proc.stdout
    manifest = load_manifest(repo)
    assert [(k.name, k.problem_rel, k.kernel_rel) for k in manifest.kernels] == [
        ("add", "problems/add.py", "kernels/add.py"), ("relu", "problems/relu.py", "kernels/relu.py"),
        ("scale", "problems/scale.py", "kernels/scale.py")]
    assert all(k.target_speedup == 1.0 and k.tolerance == 0.1 and k.backend == "triton" for k in manifest.kernels)
    again = run(["init"], repo, cache)
    assert again.returncode == 2 and "--force" in one_error_line(again)

    (repo / "kernelagent.toml").write_text('[[kernel]]\nproblem = "problems/relu.py"   # paths relative to '
                                           'the manifest\nkernel = "kernels/relu.py"\n')
    minimal = load_manifest(repo / "kernelagent.toml")
    assert [k.name for k in minimal.kernels] == ["relu"] and minimal.model is None


# -- the speed rules, on results as a GPU would give them (no GPU needed to judge them) ------
def gpu_result(speedup: float, interval: list[float] | None = None, status: str = "correct"):
    from kernelagent.harness import EvalResult, Timing

    timing = Timing(median_ms=1.0, q1_ms=0.9, q3_ms=1.1, min_ms=0.8, reps=100)
    result = EvalResult(status=status, compiled=True, correct=status == "correct",
                        timings={"candidate": timing, "eager": timing, "compile": timing},
                        speedups={"eager": speedup * 2, "compile": speedup},
                        fingerprint={"cuda": True, "gpu_name": "NVIDIA H100"},
                        problem_sha256="p" * 64, candidate_sha256="k" * 64)
    if interval is not None:
        # EvalResult.speedup_intervals comes with issue 13; set it whether or not the field exists yet.
        object.__setattr__(result, "speedup_intervals", {"compile": interval})
    return result


def entry(target: float = 1.0, tolerance: float = 0.1):
    from kernelagent.ci.manifest import KernelEntry

    return KernelEntry(name="k", problem=Path("/p.py"), kernel=Path("/k.py"), problem_rel="p.py",
                       kernel_rel="k.py", target_speedup=target, tolerance=tolerance)


GPU_ENV = {"cuda": True, "gpu_name": "NVIDIA H100"}


def locked(speedup: float, gpu: str = "NVIDIA H100") -> dict:
    return {"problem_sha256": "p" * 64, "kernel_sha256": "k" * 64, "speed_checked": True, "baseline": "compile",
            "speedups": {"compile": speedup}, "environment": {"gpu_name": gpu}}


def test_target_uses_the_lower_bound_and_falls_back_to_the_point_estimate():
    from kernelagent.ci.verify import check_kernel

    ok = check_kernel(entry(1.0), gpu_result(1.3, [1.1, 1.5]), None, environment=GPU_ENV)
    assert ok.passed and ok.speed_checked and ok.speedup_low == 1.1 and ok.baseline == "compile"
    low = check_kernel(entry(1.0), gpu_result(1.3, [0.95, 1.6]), None, environment=GPU_ENV)
    assert not low.passed and low.short_of_target and "lower bound 0.950x vs TorchInductor" in low.message()
    point = check_kernel(entry(1.2), gpu_result(1.1), None, environment=GPU_ENV)  # no interval measured
    assert point.speedup_low == 1.1 and "no interval measured" in point.message()
    off = check_kernel(entry(0.0), gpu_result(0.5), None, environment=GPU_ENV)  # target 0: no target
    assert off.passed


def test_regression_against_the_lock_counts_only_on_the_same_gpu_model():
    from kernelagent.ci.verify import check_kernel

    slower = check_kernel(entry(1.0, tolerance=0.1), gpu_result(1.5), locked(2.0), environment=GPU_ENV)
    assert not slower.passed and "regressed: 1.500x vs TorchInductor, the lock has 2.000x" in slower.message()
    within = check_kernel(entry(1.0, tolerance=0.3), gpu_result(1.5), locked(2.0), environment=GPU_ENV)
    assert within.passed
    other_gpu = check_kernel(entry(1.0), gpu_result(1.5), locked(2.0, gpu="NVIDIA A100"), environment=GPU_ENV)
    assert other_gpu.passed
    wrong = check_kernel(entry(), gpu_result(3.0, status="incorrect"), locked(2.0), environment=GPU_ENV)
    assert not wrong.passed and not wrong.short_of_target and wrong.message().startswith("incorrect")


def test_lock_is_stable_and_keeps_dates_of_unchanged_entries(tmp_path):
    from kernelagent.ci.lock import merge_entry, read_lock, write_lock

    path = tmp_path / "kernelagent.lock.json"
    entry_a = {"kernel_sha256": "a", "speedups": {"compile": 1.234567}, "date": "2024-01-01"}
    assert write_lock(path, {"b": {"x": 1}, "a": entry_a})
    text = path.read_text()
    assert text.index('"a"') < text.index('"b"') and "1.235" in text and "1.234567" not in text
    assert not write_lock(path, read_lock(path))  # unchanged: not rewritten
    same = merge_entry(read_lock(path)["a"], {**entry_a, "date": "2030-05-05"})
    assert same["date"] == "2024-01-01"
    changed = merge_entry(read_lock(path)["a"], {**entry_a, "kernel_sha256": "c", "date": "2030-05-05"})
    assert changed["date"] == "2030-05-05"


@pytest.mark.slow
def test_init_from_bench_takes_the_best_kernels(repo, cache, tmp_path):
    (repo / "kernels" / "scale.py").write_text(WRONG_RELU)  # scale has no correct kernel in this run
    run_dir = tmp_path / "bench-run"
    bench = run(["bench", str(repo / "problems"), "--candidates", str(repo / "kernels"), "--gpus", "cpu",
                 "--trials", "1", "--no-timing", "--no-baselines", "--out", str(run_dir), "--no-live"],
                tmp_path, cache)
    assert bench.returncode == 0, bench.stdout + bench.stderr
    target = tmp_path / "new-repo"
    proc = run(["init", str(target), "--from-bench", str(run_dir)], tmp_path, cache)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped scale: no correct kernel in the run" in proc.stdout
    from kernelagent.ci.manifest import load_manifest

    manifest = load_manifest(target)
    assert sorted(k.name for k in manifest.kernels) == ["add", "relu"]
    for name in ("add", "relu"):
        assert (target / "kernels" / f"{name}.py").read_text() == (repo / "kernels" / f"{name}.py").read_text()
        assert (target / "problems" / f"{name}.py").read_text() == (repo / "problems" / f"{name}.py").read_text()


def test_seeded_agent_never_ends_with_less_than_its_initial_kernel(tmp_path):
    """`optimize(initial=...)`: a passing initial kernel is the first candidate, so a model
    that only answers wrong kernels still ends with it (and the model saw it in the task)."""
    from kernelagent.orchestrate import optimize
    from kernelagent.models.scripted import ScriptedModel

    current = (CI_REPO / "kernels" / "relu.py").read_text()
    model = ScriptedModel([block(WRONG_RELU)])
    run_ = optimize(CI_REPO / "problems" / "relu.py", model, mode="text", max_turns=1, out=tmp_path / "run",
                    device="cpu", trials=2, quick_trials=1, initial=current)
    assert run_.exit_code == 0 and run_.result.best.code == current
    assert (tmp_path / "run" / "kernel.py").read_text() == current
    steps = json.loads((tmp_path / "run" / "trajectory.json").read_text())["steps"]
    assert [o["verdict"] for s in steps for o in s["observations"]] == ["correct", "incorrect"]
