"""The verifiable reward: the formula on synthetic verdicts, the known candidates through the
real harness (CPU), the TRL-shaped call (sync and async), None only for infrastructure
failures, and the optional judge (off by default, reported apart, mixed only when asked)."""

from __future__ import annotations

import asyncio
import inspect
import json

import pytest

from kernelagent.harness import EvalResult, Flag, Status, Timing
from kernelagent.rl import KernelReward, RewardConfig, extract_candidate, reward_from_result
from kernelagent.rl.judge import Judge, parse_scores
from kernelagent.rl.trl import NoCandidate
from tests.conftest import CANDIDATES, read
from tests.fake_openai_server import FakeOpenAIServer, text
from tests.rl_fixtures.common import GOOD, MUTATES, RELU_PROBLEM, SYNTAX, WRONG, fast_config, shared_pool

A, B, G = 0.5, 1.0, 1.0  # the documented defaults


def formula(compiled: bool, correct: bool, speedup: float | None, cfg: RewardConfig = RewardConfig()) -> float:
    speed = min(speedup, cfg.r_max) if (correct and speedup is not None) else 0.0
    return cfg.compile_weight * compiled + cfg.correct_weight * correct + cfg.speed_weight * speed


def timed(meaningful: bool = True, **speedups: float) -> EvalResult:
    timings = {"candidate": Timing(1.0, 0.9, 1.1, 0.8, 10, meaningful)}
    for name, s in speedups.items():
        timings[name] = Timing(s, s, s, s, 10, meaningful)
    return EvalResult(status=Status.CORRECT, compiled=True, correct=True, timings=timings,
                      speedups=dict(speedups))


# == the formula, on synthetic verdicts ================================================
def test_defaults_are_the_published_recipe():
    cfg = RewardConfig()
    assert (cfg.compile_weight, cfg.correct_weight, cfg.speed_weight, cfg.r_max, cfg.baseline) == (0.5, 1.0, 1.0, 3.0, "compile")
    assert cfg.judge_weight == 0.0 and cfg.mix_judge is False
    with pytest.raises(ValueError):
        RewardConfig(baseline="inductor")


@pytest.mark.parametrize("result,expected", [
    (EvalResult(status=Status.COMPILE_ERROR), formula(False, False, None)),
    (EvalResult(status=Status.INCORRECT, compiled=True), formula(True, False, None)),
    (EvalResult(status=Status.RUNTIME_ERROR, compiled=True), formula(True, False, None)),
    (EvalResult(status=Status.TIMEOUT, compiled=False), 0.0),
    (timed(compile=2.0, eager=5.0), formula(True, True, 2.0)),
    (timed(compile=0.5, eager=0.9), formula(True, True, 0.5)),
    (timed(compile=10.0, eager=12.0), formula(True, True, 3.0)),  # capped at r_max
    (timed(meaningful=False, eager=4.0), formula(True, True, None)),  # CPU: no speed term
])
def test_formula(result, expected):
    got = reward_from_result(result)
    assert got.reward == pytest.approx(expected) and got.verifiable == pytest.approx(expected)
    assert got.value == pytest.approx(expected)


def test_speed_term_details_and_baselines():
    r = reward_from_result(timed(compile=2.0, eager=5.0))
    assert (r.compile_term, r.correct_term, r.speed_term, r.speedup, r.baseline) == (A, B, 2.0, 2.0, "compile")
    eager = reward_from_result(timed(compile=2.0, eager=5.0), RewardConfig(baseline="eager"))
    assert eager.reward == pytest.approx(A + B + 3.0) and eager.baseline == "eager"
    fallback = reward_from_result(timed(eager=1.5))  # no TorchInductor timing: eager, said so
    assert fallback.reward == pytest.approx(A + B + 1.5) and fallback.baseline == "eager"
    assert any("no compile baseline" in n for n in fallback.notes)
    cpu = reward_from_result(timed(meaningful=False, eager=4.0))
    assert cpu.speed_term == 0.0 and any("not meaningful" in n for n in cpu.notes)
    custom = RewardConfig(compile_weight=0.2, correct_weight=2.0, speed_weight=0.5, r_max=2.0)
    assert reward_from_result(timed(compile=4.0), custom).reward == pytest.approx(0.2 + 2.0 + 0.5 * 2.0)


def test_flagged_is_incorrect_and_rejected_earns_nothing():
    flagged = timed(compile=2.0)
    flagged.flags.append(Flag("extra-inputs", "passes only the main shape", "review"))
    r = reward_from_result(flagged)
    assert not r.correct and r.compiled and r.flagged and r.reward == pytest.approx(A)
    hack = timed(compile=2.0)
    hack.flags.append(Flag("aliasing", "output aliases an input", "reject"))
    r = reward_from_result(hack)
    assert r.rejected and not r.compiled and not r.correct and r.reward == 0.0
    rejected = EvalResult(status=Status.REJECTED, compiled=True, reason="mutated its input")
    assert reward_from_result(rejected).reward == 0.0


def test_infrastructure_failures_are_none():
    for status in (Status.HARNESS_ERROR, Status.BAD_PROBLEM):
        r = reward_from_result(EvalResult(status=status))
        assert r.infra_error and r.value is None
    # a dict (as the trajectory stores verdicts) works the same
    assert reward_from_result(timed(compile=2.0).to_dict()).reward == pytest.approx(A + B + 2.0)


def test_extract_candidate_from_chat_plain_and_tool_calls():
    code = "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n"
    fenced = f"Plan.\n```python\n{code}```"
    assert extract_candidate(fenced) == code
    assert extract_candidate([{"role": "assistant", "content": fenced}]) == code
    assert extract_candidate({"role": "assistant", "content": fenced}) == code
    assert extract_candidate(code) == code  # a bare module, no fences
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "submit", "arguments": json.dumps({"code": code})}}]}
    assert extract_candidate([call]) == code
    for bad in ("no code", [{"role": "assistant", "content": "```python\nprint(1)\n```"}], None,
                f"```python\n{code}"):
        with pytest.raises(NoCandidate):
            extract_candidate(bad)


_CODE = json.dumps("import torch\nclass ModelNew(torch.nn.Module):\n    pass\n")


@pytest.mark.parametrize("arguments", ["[" * 200_000 + "]" * 200_000, '{"code": ' + _CODE + ', "t": 1e400}',
                                       '{"code": ' + _CODE + ', "n": ' + str(10**400) + "}"],
                         ids=["deep", "inf", "huge-int"])
def test_unbounded_tool_arguments_are_no_candidate(arguments):
    """Issue 54, class 5: the policy's tool-call arguments are parsed bounded; a 200,000-deep
    array raised RecursionError out of the reward function (the whole batch lost its rewards)."""
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "submit", "arguments": arguments}}]}
    with pytest.raises(NoCandidate):
        extract_candidate([call])


# == the real harness, TRL-shaped =======================================================
def trl_kwargs(completions: list, problem_source: str) -> dict:
    """Exactly what GRPOTrainer passes: prompts, completions, completion_ids, the dataset
    columns (all but prompt), trainer_state (and, in newer versions, log hooks)."""
    n = len(completions)
    prompt = [{"role": "user", "content": "write a kernel"}]
    return dict(prompts=[prompt] * n, completions=completions, completion_ids=[[1, 2, 3]] * n,
                problem_id=["relu_problem"] * n, problem_source=[problem_source] * n,
                problem_path=[str(RELU_PROBLEM)] * n, trainer_state=object(),
                log_extra=lambda column, values: None, log_metric=lambda name, value: None)


def chat(code: str, prose: str = "Here is my kernel.") -> list[dict]:
    return [{"role": "assistant", "content": f"{prose}\n\n```python\n{code}```"}]


class Counting:
    """A backend wrapper that counts evaluations (to see the batch deduplicated)."""

    def __init__(self, pool):
        self.pool, self.jobs = pool, 0

    def submit(self, *job):
        self.jobs += 1
        return self.pool.submit(*job)


def test_known_candidates_through_a_trl_shaped_call():
    backend = Counting(shared_pool())
    reward = KernelReward(backend, eval_config=fast_config())
    completions = [chat(GOOD), chat(WRONG), chat(SYNTAX), chat(MUTATES), "no code at all",
                   f"Plain text answer.\n```python\n{GOOD}```", chat(WRONG)]
    values = reward(**trl_kwargs(completions, read(RELU_PROBLEM)))
    # correct on the CPU: compile + correct, no speed term; wrong: compile only; syntax error:
    # 0; a kernel that mutates its input: rejected by the defences, 0; no code: 0.
    assert values == [formula(True, True, None), formula(True, False, None), 0.0, 0.0, 0.0,
                      formula(True, True, None), formula(True, False, None)]
    assert all(isinstance(v, float) for v in values)
    assert [b.status for b in reward.last] == ["correct", "incorrect", "compile_error", "rejected",
                                               "no_code", "correct", "incorrect"]
    assert reward.last[3].rejected and reward.last[3].compile_term == 0.0
    assert backend.jobs == 4  # identical (problem, kernel) pairs are evaluated once


# issue 54, class 5: sources the caller's static pass could not parse (a RecursionError in
# ast.parse: `eval` exited 70 and the reward was None) or walk (its recursive visitors)
LONG_EXPRESSION = GOOD + "\n\ndef _unused(x):\n    return " + " + ".join(["x"] * 5000) + "\n"
DEEP_UNARY = GOOD + "\n\n_DEEP = " + "-" * 3000 + "1\n"
WALKED_TOO_DEEP = GOOD + "\n\n_MID = " + " + ".join(["1"] * 450) + "\n"


@pytest.mark.parametrize("code", [LONG_EXPRESSION, DEEP_UNARY, WALKED_TOO_DEEP],
                         ids=["5000-terms", "3000-unary", "450-terms"])
def test_a_source_too_deep_for_the_static_pass_is_a_compile_error_with_its_reward(code):
    reward = KernelReward(shared_pool(), eval_config=fast_config())
    values = reward(**trl_kwargs([chat(code)], read(RELU_PROBLEM)))
    assert values == [0.0] and reward.last[0].status == "compile_error", reward.last[0]
    assert "too deeply nested" in reward.last[0].reason


def test_async_variant_and_none_for_infrastructure():
    reward = KernelReward(shared_pool(), eval_config=fast_config())
    fn = reward.as_async()
    assert inspect.iscoroutinefunction(fn)  # how GRPOTrainer recognises async reward functions
    values = asyncio.run(fn(**trl_kwargs([chat(WRONG), "nothing"], read(RELU_PROBLEM))))
    assert values == [formula(True, False, None), 0.0]
    # a broken problem is not the policy's fault: None, and so is a backend that breaks
    broken = read(CANDIDATES / "bad_problem_raises.py")
    assert reward(**trl_kwargs([chat(GOOD)], broken)) == [None]

    class Broken:
        def submit(self, *job):
            raise RuntimeError("GPU fell off the bus")

    assert KernelReward(Broken())(completions=[chat(GOOD), "x"], problem_source=[read(RELU_PROBLEM)] * 2) == [None, 0.0]
    with pytest.raises(ValueError, match="problem"):
        reward(prompts=["p"], completions=[chat(GOOD)])  # no problem column: a config error


# == the judge ===========================================================================
def test_parse_judge_scores():
    s = parse_scores('Sure: {"correctness": 0.8, "compilability": 1.0, "speed": 0.3}')
    assert s.score == pytest.approx((0.8 + 1.0 + 0.3) / 3) and s.scores["speed"] == 0.3
    assert parse_scores('{"correctness": 8, "compilability": 10, "speed": 3}').score == pytest.approx(0.7)
    assert parse_scores("no json").score is None
    assert parse_scores('{"correctness": "high"}').score is None


def test_judge_is_reported_apart_and_mixed_only_when_asked():
    result = EvalResult(status=Status.INCORRECT, compiled=True)
    with FakeOpenAIServer() as server:
        server.add(text('{"correctness": 0.6, "compilability": 0.9, "speed": 0.3}'),
                   text('{"correctness": 0.6, "compilability": 0.9, "speed": 0.3}'))
        judge = Judge("openai/fake-judge", api_base=server.url, api_key="test-key", timeout=10)
        score = judge.score(read(RELU_PROBLEM), WRONG)
        assert score.score == pytest.approx(0.6) and not score.error
        separate = reward_from_result(result, RewardConfig(judge_weight=0.5), judge=score)
        assert separate.reward == pytest.approx(A) and separate.judge_term == pytest.approx(0.3)
        mixed = reward_from_result(result, RewardConfig(judge_weight=0.5, mix_judge=True),
                                   judge=judge.score(read(RELU_PROBLEM), WRONG))
        assert mixed.reward == pytest.approx(A + 0.3) and mixed.verifiable == pytest.approx(A)
        assert "fake-judge" in json.dumps(server.requests[0]) and "leaky_kernel" in json.dumps(server.requests[0])
    # a judge that cannot be reached is a note, never a crash, and the reward is unchanged
    down = Judge("openai/fake-judge", api_base="http://127.0.0.1:9/v1", api_key="k", timeout=2).score("a", "b")
    assert down.score is None and down.error
    assert reward_from_result(result, RewardConfig(judge_weight=1.0, mix_judge=True), judge=down).reward == pytest.approx(A)


def test_reward_pays_the_point_estimate_not_the_lower_bound():
    """Documented choice (issue 13): decisions use the interval's low end, the reward the point."""
    result = timed(compile=1.5, eager=3.0)
    result.speedup_intervals = {"compile": [0.9, 2.0], "eager": [2.5, 3.5]}
    breakdown = reward_from_result(result, RewardConfig())
    assert breakdown.speedup == 1.5 and breakdown.reward == pytest.approx(formula(True, True, 1.5))


def test_sft_export_and_search_read_unbounded_tool_arguments_as_none():
    """The same bounded parse where a trajectory's tool calls are exported (rl/sft.py) and where a
    search takes the code of a reply (search/runner.py)."""
    from kernelagent.agent.loop import FormatError
    from kernelagent.rl.sft import _tool_call
    from kernelagent.search.runner import _code_of

    deep = "[" * 200_000 + "]" * 200_000
    assert _tool_call({"function": {"name": "submit", "arguments": deep}})["function"]["arguments"] == {}
    with pytest.raises(FormatError):  # no candidate in the reply, as for any other unreadable arguments
        _code_of({"content": "", "tool_calls": [{"arguments_json": deep}]})
