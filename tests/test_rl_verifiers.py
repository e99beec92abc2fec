"""The verifiers environment: KernelEnv episodes driven the way verifiers 0.1.x's
`MultiTurnEnv.rollout` drives them (setup_state, then env_response after each model reply
until `final_env_response` or max_turns, then the rubric), with scripted model replies and
the real harness on the CPU."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from kernelagent.rl.verifiers_env import KernelEpisodes
from tests.rl_fixtures.common import GOOD, RELU_PROBLEM, WRONG, block, shared_pool

CORRECT_ON_CPU = 0.5 + 1.0  # compile + correct; no speed term on the CPU
COMPILE_ONLY = 0.5
OVERRIDES = {"target_ms": 10, "warmup_ms": 2, "max_reps": 10}


def episodes(**kw) -> KernelEpisodes:
    return KernelEpisodes(shared_pool(), trials=2, quick_trials=2, eval_overrides=OVERRIDES, **kw)


def rollout(eps: KernelEpisodes, replies: list, max_turns: int, info: dict) -> tuple[dict, float]:
    """MultiTurnEnv.rollout's order of calls, with a scripted policy."""
    state: dict = {"info": info, "trajectory": [], "final_env_response": None}
    prompt = eps.start(state)
    messages = list(prompt)
    replies = list(replies)
    while not state["final_env_response"] and len(state["trajectory"]) < max_turns:
        if state["trajectory"]:  # get_prompt_messages: the env answers the previous reply
            messages += eps.respond(messages, state)
            if state["final_env_response"]:
                break
        reply = replies.pop(0)
        messages.append(reply if isinstance(reply, dict) else {"role": "assistant", "content": reply})
        state["trajectory"].append(reply)
    completion = messages[len(prompt):]
    return state, eps.reward(state, completion)


def test_correct_kernel_ends_the_episode_with_full_reward():
    eps = episodes(mode="text", max_turns=3)
    state, reward = rollout(eps, ["No code yet.", block(WRONG, "Leaky."), block(GOOD, "max(x, 0).")],
                            max_turns=3, info={"problem_path": str(RELU_PROBLEM)})
    assert reward == pytest.approx(CORRECT_ON_CPU)
    env = state["kernel_env"]
    assert env.done and env.final.correct and env.run_result.outcome == "success"
    assert [m["role"] for m in env.messages].count("assistant") == 3
    assert state["kernel_reward"]["status"] == env.final.status


def test_wrong_kernel_gets_compile_credit_only_and_last_reply_is_scored():
    # max_turns=1: verifiers stops before env_response, so the reward must step the reply.
    eps = episodes(mode="text", max_turns=1)
    state, reward = rollout(eps, [block(WRONG, "Leaky relu.")], max_turns=1,
                            info={"problem_source": RELU_PROBLEM.read_text(), "problem_id": "relu"})
    assert reward == pytest.approx(COMPILE_ONLY)
    env = state["kernel_env"]
    assert not env.final.correct and env.problem.display
    assert state["kernel_stepped"] == 1


def test_tools_mode_steps_tool_calls():
    eps = episodes(mode="tools", max_turns=3)
    call = {"role": "assistant", "content": "", "tool_calls": [  # verifiers 0.1.14's flat form
        {"id": "c1", "name": "submit", "arguments": json.dumps({"code": GOOD})}]}
    state, reward = rollout(eps, [call], max_turns=3, info={"problem_path": str(RELU_PROBLEM)})
    assert reward == pytest.approx(CORRECT_ON_CPU)
    assert {s["function"]["name"] for s in state["kernel_tool_schemas"]} >= {"compile", "submit"}
    tool_msgs = [m for m in state["final_env_response"] if m["role"] == "tool"]
    assert tool_msgs and tool_msgs[0]["tool_call_id"] == "c1"


def test_row_without_problem_is_refused():
    with pytest.raises(ValueError, match="problem_source"):
        episodes(mode="text").start({"info": {}})


def test_importing_does_not_import_verifiers():
    code = "import kernelagent.rl.verifiers_env, sys; print('verifiers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _verifiers_0_1():
    try:
        from verifiers.envs.multiturn_env import MultiTurnEnv  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "not usable here"
        return f"{type(exc).__name__}: {exc}"
    return None


VF_MISSING = _verifiers_0_1()


@pytest.mark.skipif(VF_MISSING is not None, reason=(
    "verifiers 0.1.x MultiTurnEnv is not importable here "
    f"({VF_MISSING}); verifiers 0.1.14 pins datasets<4.7 (the train extra has 5.2) and pulls "
    "openai 3.x, so it is not installed next to the train extra"))
def test_verifiers_multiturn_env_class():
    from verifiers.envs.multiturn_env import MultiTurnEnv

    from kernelagent.rl.verifiers_env import load_environment

    prompt = [{"role": "user", "content": "optimize"}]
    env = load_environment(shared_pool(), dataset=[{"prompt": prompt, "problem_path": str(RELU_PROBLEM)}],
                           mode="text", max_turns=2,
                           env_options={"trials": 2, "quick_trials": 2, "eval_overrides": OVERRIDES})
    assert isinstance(env, MultiTurnEnv)
    state: dict = {"info": {"problem_path": str(RELU_PROBLEM)}, "trajectory": [],
                   "final_env_response": None}
    asyncio.run(env.setup_state(state))
    reply = {"role": "assistant", "content": block(GOOD, "max(x, 0).")}
    feedback = asyncio.run(env.env_response([*prompt, reply], state))
    assert feedback and state["final_env_response"]
    assert env.episodes.reward(state) == pytest.approx(CORRECT_ON_CPU)
