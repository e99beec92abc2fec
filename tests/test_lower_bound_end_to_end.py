"""One candidate result, three consumers: `optimize`, `bench` and `verify` must each decide
"faster than TorchInductor" on the LOW end of the speedup's 95% interval, never on its point
estimate (issue 13; harness/stats.py `beats`).

The result is 1.12x over Inductor (the "compile" baseline) with the interval [0.90, 1.30]:
its point estimate clears a 1.0x target, its lower bound does not. A second result, 1.12x
with [1.05, 1.20], clears it on the lower bound as well (the control).

Speedups mean something only on a GPU, and there is none here: a scripted TEST DOUBLE
(ScriptedGpuEvaluator) stands in for the harness and answers each candidate with a fixed
EvalResult that claims a GPU. Nothing is measured; what is checked is the decision logic from
that result onwards: the CLI `kernelagent optimize` (orchestrate.optimize, the agent loop, its
exit code and summary.json), `run_bench` (store, records, metrics.fast_p, the HTML report) and
the CLI `kernelagent verify` (stats.beats in ci/verify.py, exit code, JSON report)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelagent.harness.result import EvalResult, Status, Timing, TrialResult
from kernelagent.problem import sha256_text
from tests.conftest import CANDIDATES, read

PROBLEM = read(CANDIDATES / "relu_problem.py")  # the harness tests' small ReLU problem
# The candidates' sources: the double answers by the marker word in each.
NOISY = "# noisy candidate (scripted result: 1.12x, [0.90, 1.30])\nclass ModelNew:\n    pass\n"
SURE = "# sure candidate (scripted result: 1.12x, [1.05, 1.20])\nclass ModelNew:\n    pass\n"
POINT = 1.12
INTERVALS = {"noisy": [0.90, 1.30], "sure": [1.05, 1.20]}


def scripted_result(problem_sha256: str, source: str, config=None) -> EvalResult:
    """The fixed verdict the double gives: correct, and (when timing is asked for) a speedup
    over Inductor of 1.12x with the interval of the candidate's marker. Not a measurement."""
    marker = "noisy" if "noisy" in source else "sure"
    result = EvalResult(status=Status.CORRECT, compiled=True, correct=True,
                        trials=[TrialResult(name="trial 0", seed=0, passed=True)],
                        fingerprint=ScriptedGpuEvaluator.FINGERPRINT, device="scripted test double",
                        problem_sha256=problem_sha256, candidate_sha256=sha256_text(source))
    if config is not None and not config.timing:
        return result  # compile / run_tests: nothing timed
    timing = Timing(median_ms=1.0, q1_ms=0.95, q3_ms=1.05, min_ms=0.9, reps=100, meaningful=True)
    result.timings = {"candidate": timing, "eager": timing, "compile": timing}
    result.speedups = {"eager": 3.0, "compile": POINT}
    result.speedup_intervals = {"eager": [2.8, 3.2], "compile": list(INTERVALS[marker])}
    return result


class ScriptedGpuEvaluator:
    """TEST DOUBLE for kernelagent.harness.Evaluator (and for each evaluator of an
    EvaluatorPool): runs nothing, times nothing, and answers `scripted_result`."""

    FINGERPRINT = {"cuda": True, "gpu_name": "scripted test double (no GPU)", "python": "test",
                   "torch": "test", "triton": "test"}

    made: list["ScriptedGpuEvaluator"] = []  # every double made, for the tests to read
    audited_role: str | None = None  # set: every result says a Nsight Compute session judged it

    def __init__(self, **_settings) -> None:
        self.evaluated: list[str] = []
        self.configs: list = []
        ScriptedGpuEvaluator.made.append(self)

    def __enter__(self) -> "ScriptedGpuEvaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        pass

    def fingerprint(self) -> dict:
        return dict(self.FINGERPRINT)

    def evaluate(self, problem, candidate_source: str, config=None, *, cancel=None) -> EvalResult:
        """EvaluatorProtocol's evaluate (cancel: nothing here to stop)."""
        self.evaluated.append(candidate_source)
        self.configs.append(config)
        result = scripted_result(problem.sha256, candidate_source, config)
        if self.audited_role and result.timings:
            result.kernel_evidence = {"source": "ncu", "role": self.audited_role}
        return result


class ScriptedPool:
    """TEST DOUBLE for harness.caller.pool.EvaluatorPool: one ScriptedGpuEvaluator."""

    def __init__(self, devices=None, **_settings) -> None:
        self.devices = list(devices or ["cpu"])[:1]
        self.evaluators = [ScriptedGpuEvaluator()]

    def __enter__(self) -> "ScriptedPool":
        return self

    def __exit__(self, *exc) -> None:
        pass


@pytest.fixture
def no_harness(tmp_path, monkeypatch):
    """Every harness the code under test would start is the double; nothing outside tmp_path."""
    import kernelagent.harness as harness
    import kernelagent.harness.caller.pool as pool
    import kernelagent.orchestrate.run as orchestrate_run

    ScriptedGpuEvaluator.made.clear()
    monkeypatch.setattr(ScriptedGpuEvaluator, "audited_role", None)
    monkeypatch.setattr(harness, "Evaluator", ScriptedGpuEvaluator)
    monkeypatch.setattr(pool, "EvaluatorPool", ScriptedPool)
    # optimize inspects the inputs in a child process that imports torch: not what is tested here.
    monkeypatch.setattr(orchestrate_run, "describe_inputs",
                        lambda path, timeout=120.0: {"get_inputs": ["Tensor(shape=(256, 1024), dtype=float32)"]})
    monkeypatch.setenv("KERNELAGENT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    for name in ("KERNELAGENT_MODEL", "KERNELAGENT_API_BASE", "KERNELAGENT_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_the_double_gives_a_point_above_and_a_lower_bound_below_the_target():
    """The premise of every test below, stated once through the shared rule."""
    from kernelagent.harness.stats import beats

    noisy, sure = scripted_result("p" * 64, NOISY), scripted_result("p" * 64, SURE)
    assert noisy.speedups["compile"] == sure.speedups["compile"] == POINT > 1.0
    assert not beats(noisy.speedup_intervals["compile"], POINT, 1.0)
    assert beats(sure.speedup_intervals["compile"], POINT, 1.0)


# -- 1. optimize: the agent's target ------------------------------------------------------
@pytest.mark.parametrize("marker, source, outcome, exit_code", [
    ("noisy", NOISY, "short_of_target", 3),  # 1.12 >= 1.0 on the point estimate, 0.90 < 1.0 on the lower bound
    ("sure", SURE, "success", 0),
], ids=["noisy", "sure"])
def test_optimize_judges_the_target_on_the_lower_bound(no_harness, tmp_path, marker, source, outcome, exit_code):
    from kernelagent.cli import app

    problem = write(tmp_path / "relu.py", PROBLEM)
    reply = write(tmp_path / "reply.py", source)  # scripted:FILE.py: one text reply holding it
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["optimize", str(problem), "--model", f"scripted:{reply}", "--mode", "text",
                                      "--max-turns", "1", "--target-speedup", "1.0", "--device", "cpu",
                                      "--out", str(out), "--quiet"])
    assert result.exit_code == exit_code, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"] == outcome and summary["exit_code"] == exit_code
    assert summary["best"]["speedup_vs_inductor"] == POINT  # the same point estimate either way
    low, high = INTERVALS[marker]
    assert summary["best"]["speedup_intervals"]["compile"] == [low, high]
    met = "met" if exit_code == 0 else "not met"
    assert summary["target_check"] == (f"1.120x [{low:.3f}, {high:.3f}] vs TorchInductor, target 1x "
                                       f"on the lower bound: {met}")
    # The noisy kernel did not stop the run (the budget did); the sure one met the target.
    assert summary["stop_reason"] == ("limits" if exit_code else "target_met")
    assert (out / "kernel.py").read_text() == source


@pytest.mark.parametrize("role, audited_again", [(None, True), ("audit", False), ("fallback", False)],
                         ids=["trace-only", "audited", "ncu-fallback"])
def test_optimizes_final_kernel_on_a_gpu_is_audited_once(no_harness, tmp_path, role, audited_again):
    """Issue 55: the kernel a run ends with is shown to a person, so Nsight Compute audits it.
    A text-mode evaluation (full trials, timed) judged by its trace alone is verified once more
    with `audit`; one a session already judged is not evaluated again. The agent's other turns
    audit only the seeded share (EvalConfig.audit_wins off)."""
    from kernelagent.cli import app

    ScriptedGpuEvaluator.audited_role = role
    problem = write(tmp_path / "relu.py", PROBLEM)
    reply = write(tmp_path / "reply.py", SURE)
    result = CliRunner().invoke(app, ["optimize", str(problem), "--model", f"scripted:{reply}", "--mode", "text",
                                      "--max-turns", "1", "--target-speedup", "1.0", "--device", "cpu",
                                      "--out", str(tmp_path / "out"), "--quiet"])
    assert result.exit_code == 0, result.output
    configs = [c for double in ScriptedGpuEvaluator.made for c in double.configs]
    assert not configs[0].audit and not configs[0].audit_wins  # the turn itself
    if audited_again:
        assert len(configs) == 2 and configs[1].audit and configs[1].trials == configs[0].trials
    else:
        assert len(configs) == 1


@pytest.mark.parametrize("flags, audit_wins", [([], False), (["--audit", "wins"], True)])
def test_bench_candidates_audit_their_wins_and_eval_when_asked(no_harness, tmp_path, flags, audit_wins):
    """Issue 55: bench's counted wins are shown to a person as wins: their configs ask a win to be
    audited (EvalConfig.audit_wins). A plain `kernelagent eval` is audited on the seeded share, as
    the issue's list of audited wins has it; `eval --audit wins` asks for every win."""
    from kernelagent.bench.runner import BenchSpec
    from kernelagent.cli import app

    assert BenchSpec(root=str(tmp_path)).eval_config().audit_wins
    problem = write(tmp_path / "relu.py", PROBLEM)
    candidate = write(tmp_path / "cand.py", SURE)
    CliRunner().invoke(app, ["eval", str(problem), str(candidate), "--device", "cpu", "--no-daemon", *flags])
    [double] = ScriptedGpuEvaluator.made
    assert [c.audit_wins for c in double.configs] == [audit_wins]


# -- 2. bench: fast_p and its report ------------------------------------------------------
@pytest.mark.parametrize("mode", ["candidates", "agent"])
def test_bench_fast_p_counts_the_lower_bound_and_the_report_says_so(no_harness, tmp_path, mode):
    from kernelagent.bench.runner import BenchSpec, Session, run_bench
    from kernelagent.models import ScriptedModel, text_reply

    root = tmp_path / "bench"
    write(root / "level1" / "1_relu.py", PROBLEM)
    if mode == "candidates":
        write(tmp_path / "cands" / "level1" / "1_relu.py", NOISY)
        spec = BenchSpec(root=str(root), candidates=str(tmp_path / "cands"), trials=2)
        factory = None
    else:  # the agent proposes the same kernel; its run's summary becomes the record
        spec = BenchSpec(root=str(root), agent_mode="text", max_turns=1, target_speedup=1.0, trials=2)

        def factory(_spec):
            return ScriptedModel([text_reply(f"```python\n{NOISY}```")])
    session = Session(gpus="cpu", store=str(tmp_path / "bench.sqlite"), out=str(tmp_path / "out"),
                      cache_dir=str(tmp_path / "cache"), concurrency=1, model_factory=factory)
    outcome = run_bench(spec, session)

    [record] = outcome.records
    assert record["correct"] and record["speedup_inductor"] == POINT
    assert record["interval_inductor"] == INTERVALS["noisy"]
    if mode == "agent":
        assert record["outcome"] == "short_of_target"
    m = outcome.metrics
    assert m["measured"]["inductor"] == 1 and m["point_only"]["inductor"] == 0
    assert m["fast_p"]["inductor"]["1.0"] == 0.0  # the lower bound 0.90 is not above 1.0
    assert m["fast_p_point"]["inductor"]["1.0"] == 1.0  # the point estimate 1.12 is
    assert m["fast_p"]["eager"]["1.0"] == 1.0  # [2.8, 3.2] vs eager: counted on its lower bound too
    # The report written by the run shows the lower-bound number, and the point one beside it.
    html = (outcome.out_dir / "report.html").read_text()
    assert '<tr><td>fast_1.0 (lower bound)</td><td class="num">100.0%</td><td class="num">0.0%</td></tr>' in html
    assert '<tr><td>fast_1.0 (point estimate)</td><td class="num">100.0%</td><td class="num">100.0%</td></tr>' in html
    assert ('<div class="v">0.0%</div><div class="k">fast_1.0 vs inductor (lower bound)</div>' in html)
    assert "fast_p (lower bound): correct, and the lower bound of the speedup" in html
    summary = json.loads((outcome.out_dir / "summary.json").read_text())
    assert summary["metrics"]["fast_p"]["inductor"]["1.0"] == 0.0


# -- 3. verify: the CI gate ---------------------------------------------------------------
def test_verify_fails_the_kernel_whose_lower_bound_is_below_its_target(no_harness, tmp_path):
    from kernelagent.cli import app

    repo = tmp_path / "repo"
    write(repo / "problems" / "relu.py", PROBLEM)
    write(repo / "kernels" / "noisy.py", NOISY)
    write(repo / "kernels" / "sure.py", SURE)
    write(repo / "kernelagent.toml", 'trials = 2\ntarget_speedup = 1.0\n\n'
          '[[kernel]]\nname = "noisy"\nproblem = "problems/relu.py"\nkernel = "kernels/noisy.py"\n\n'
          '[[kernel]]\nname = "sure"\nproblem = "problems/relu.py"\nkernel = "kernels/sure.py"\n')
    result = CliRunner().invoke(app, ["verify", str(repo), "--store", str(tmp_path / "store.sqlite"), "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["speed_checked"] and report["kernels_failed"] == 1
    kernels = {k["name"]: k for k in report["kernels"]}
    noisy, sure = kernels["noisy"], kernels["sure"]
    assert noisy["correct"] and noisy["speedup"] == POINT and noisy["speedup_low"] == 0.90
    assert noisy["status"] == "fail" and noisy["short_of_target"]
    assert noisy["failures"] == ["lower bound 0.900x vs TorchInductor is below the target 1x"]
    assert sure["status"] == "pass" and sure["speedup"] == POINT and sure["speedup_low"] == 1.05
    assert not sure["short_of_target"] and sure["failures"] == []
