"""The multi-turn environment: scripted episodes through the agent's own loop and tools, on
the real harness (CPU), with the prompts `optimize` sends."""

from __future__ import annotations

import json

import pytest

from kernelagent.rl.env import KernelEnv
from kernelagent.rl.reward import RewardConfig
from kernelagent.agent import optimize
from kernelagent.models import ScriptedModel
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
    assert done and reward == pytest.approx(CORRECT_ON_CPU)
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
    assert done and reward == pytest.approx(0.25 + 1.0)
    saved = json.loads((tmp_path / "trajectory.json").read_text())
    assert saved["status"] == "finished" and saved["final_verification"][0]["passed"]
