"""The multi-turn environment: scripted episodes through the agent's own loop and tools, on
the real harness (CPU), with the prompts `optimize` sends."""

from __future__ import annotations

import json

import pytest

from kernelagent.rl.env import KernelEnv
from kernelagent.rl.reward import RewardConfig
from kernelagent.orchestrate import optimize
from kernelagent.models import ScriptedModel
from tests.conftest import read
from tests.rl_fixtures.common import GOOD, RELU_PROBLEM, SYNTAX, WRONG, block, shared_pool

CORRECT_ON_CPU = 0.5 + 1.0  # compile + correct; no speed term on the CPU
OVERRIDES = {"target_ms": 10, "warmup_ms": 2, "max_reps": 10}


def env(**kw) -> KernelEnv:
    return KernelEnv(shared_pool(), trials=2, quick_trials=2, eval_overrides=OVERRIDES, **kw)


def test_text_episode_and_prompts_equal_optimize(tmp_path):
    e = env(mode="text", max_turns=3)
    prompt = e.reset(RELU_PROBLEM)
    assert [m["role"] for m in prompt] == ["system", "user"]
    # exactly the prompts `kernelagent optimize` sends its model, with the same settings
    model = ScriptedModel([block(GOOD, "max(x, 0).")])
    optimize(RELU_PROBLEM, model, mode="text", max_turns=3, out=tmp_path / "run",
             evaluator=shared_pool(), trials=2, quick_trials=2, eval_overrides=OVERRIDES)
    assert prompt == model.calls[0]["messages"]

    obs, reward, done = e.step("I have no code yet.")
    assert not done and reward == 0.0 and "class ModelNew" in obs  # the loop's format error
    obs, reward, done = e.step(block(WRONG, "Leaky first."))
    assert not done and reward == 0.0 and "incorrect" in obs
    obs, reward, done = e.step(block(GOOD, "Now max(x, 0)."))
    assert done and reward == pytest.approx(CORRECT_ON_CPU), (reward, obs[-1500:], e.final)
    assert e.final.correct and e.run_result.outcome == "success"
    roles = [m["role"] for m in e.messages]
    assert roles[:3] == ["system", "user", "assistant"] and roles.count("assistant") == 3
    assert any("last turn" in m["content"].lower() for m in e.messages if m["role"] == "user")
    with pytest.raises(RuntimeError):
        e.step("after the end")


def test_tools_episode_per_step_rewards_and_budget():
    e = env(mode="tools", max_turns=3, reward_mode="per_step")
    e.reset(str(RELU_PROBLEM))
    assert {s["function"]["name"] for s in e.tools_schema} >= {"compile", "run_tests", "submit"}

    def call(name, **args):
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c_{name}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}

    obs, reward, done = e.step(call("compile", code=SYNTAX))
    assert not done and reward == 0.0 and "compile_error" in obs
    obs, reward, done = e.step(call("compile", code=GOOD))
    assert not done and reward == pytest.approx(0.5)  # compiled (compile-only check)
    assert e.messages[-2]["role"] == "tool" and e.messages[-2]["tool_call_id"] == "c_compile"
    assert "LAST turn" in e.messages[-1]["content"]  # the loop's budget warning, as in optimize
    obs, reward, done = e.step(call("run_tests", code=WRONG))  # the last turn: budget spent
    assert done and reward == pytest.approx(0.5)  # no correct kernel: at most compile credit
    assert e.run_result.outcome == "no_correct_kernel" and e.final.correct is False


def test_submit_ends_the_episode_with_the_verified_reward(tmp_path):
    e = env(mode="tools", max_turns=5, reward_config=RewardConfig(compile_weight=0.25), out_dir=tmp_path)
    e.reset(RELU_PROBLEM)
    submit = {"role": "assistant", "content": "Submitting.", "tool_calls": [
        {"id": "s1", "function": {"name": "submit", "arguments": {"code": GOOD}}}]}
    obs, reward, done = e.step(submit)
    assert done and reward == pytest.approx(0.25 + 1.0), (done, reward, obs[-1500:])
    saved = json.loads((tmp_path / "trajectory.json").read_text())
    assert saved["status"] == "finished" and saved["final_verification"][0]["passed"]


# -- warm resets, one prompt everywhere, the gymnasium and TRL shapes ----------------------

def test_warm_reset_is_fast_and_prompts_match_dataset_and_optimize(tmp_path):
    import time

    from kernelagent.rl.dataset import build_rows

    e = env(mode="tools", max_turns=4)
    first = e.reset(RELU_PROBLEM)  # cold: inspects the inputs once (cached by content hash)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        again = e.reset(RELU_PROBLEM)
        times.append(time.perf_counter() - start)
    assert again == first
    assert min(times) < 0.5, times
    # the dataset renders the same prompt from the same templates, budget and device facts
    rows = build_rows(RELU_PROBLEM, mode="tools", gpu="cpu", max_turns=4)
    assert rows[0]["prompt"] == first
    assert "Budget: 4 turns" in first[1]["content"] and "CPU (Triton interpreter)" in first[1]["content"]


def test_finish_ends_an_episode_cut_short():
    e = env(mode="text", max_turns=5)
    e.reset(RELU_PROBLEM)
    e.step(block(WRONG, "Leaky first."))
    final = e.finish()
    assert e.done and not final.correct and final.compiled and final.reward == pytest.approx(0.5)
    assert e.finish() is final  # idempotent
    with pytest.raises(RuntimeError):
        e.step(block(GOOD, "late"))


def test_gym_wrapper_five_tuple():
    from kernelagent.rl.env import KernelGymEnv

    gym = KernelGymEnv(shared_pool(), problems=[RELU_PROBLEM], mode="text", max_turns=2, trials=2,
                       quick_trials=2, eval_overrides=OVERRIDES)
    obs, info = gym.reset(seed=3)
    assert [m["role"] for m in obs] == ["system", "user"] and info["problem"] == "relu_problem"
    obs, reward, terminated, truncated, info = gym.step(block(WRONG, "Leaky."))
    assert (reward, terminated, truncated) == (0.0, False, False) and obs[-1]["role"] == "user"
    obs, reward, terminated, truncated, info = gym.step(block(WRONG, "Still leaky."))
    assert truncated and not terminated  # the 2-turn budget ran out
    assert reward == pytest.approx(0.5) and info["reward"]["status"] == "no_verified_kernel"
    obs, info = gym.reset(options={"problem": read(RELU_PROBLEM), "problem_id": "level1/relu"})
    obs, reward, terminated, truncated, info = gym.step(block(GOOD, "max(x, 0)."))
    assert terminated and not truncated and reward == pytest.approx(CORRECT_ON_CPU)


def test_tool_env_follows_trl_contract():
    import inspect

    from kernelagent.rl.tool_env import KernelToolEnv

    factory = KernelToolEnv.factory(backend=shared_pool(), trials=2, quick_trials=2,
                                    eval_overrides=OVERRIDES, max_turns=6)
    e = factory()
    # what GRPOTrainer offers as tools: public functions of the class but reset/get_reward
    tools = sorted(n for n, _ in inspect.getmembers(type(e), predicate=inspect.isfunction)
                   if n not in ("reset", "get_reward") and not n.startswith("_"))
    assert tools == ["compile", "profile", "read_reference", "run_tests", "submit"]
    assert callable(e.finish)  # public, yet not a tool
    try:
        from transformers.utils import get_json_schema
    except ImportError:
        pass
    else:  # the schemas TRL builds from the signatures and docstrings
        schema = get_json_schema(e.compile)
        assert schema["function"]["name"] == "compile"
        assert "code" in schema["function"]["parameters"]["properties"]
        assert "code" not in schema["function"]["parameters"].get("required", [])
    row = {"prompt": [{"role": "user", "content": "task"}], "problem_source": read(RELU_PROBLEM),
           "problem_id": "level1/relu_problem"}
    assert e.reset(**row) is None  # the dataset's prompt is the task already
    assert "incorrect" in e.run_tests(WRONG).lower()
    text = e.submit(GOOD)
    assert "episode has ended" in text and e.done
    assert e.get_reward() == pytest.approx(CORRECT_ON_CPU)
    assert "ended" in e.compile(GOOD)  # no more evaluations after the end
    # a row without a prompt gets the task from reset; a rollout with no candidate scores 0
    text = e.reset(problem_path=str(RELU_PROBLEM))
    assert "class ModelNew" in text and "# Task: relu_problem" in text
    assert e.get_reward() == 0.0 and e.final.status == "no_candidate"
