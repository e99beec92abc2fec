"""The agent: budget, trajectory, truncation, code extraction, the loop's decisions, and whole
runs through the real litellm client (fake OpenAI server on 127.0.0.1) and the REAL harness
(CPU, Triton interpreter). Only the model's replies are scripted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kernelagent.agent import (
    Agent,
    AgentConfig,
    Budget,
    FormatError,
    LimitsExceeded,
    Observation,
    Prompts,
    Trajectory,
    check_target,
    extract_code,
    truncate,
)
from kernelagent.orchestrate import optimize
from kernelagent.agent import trajectory as trajectory_module
from kernelagent.agent.prompts import prompt_dirs
from kernelagent.agent.tools import TOOL_NAMES, TOOL_SCHEMAS, HarnessTools, describe_inputs
from kernelagent.models import ScriptedModel, text_reply, tool_reply
from kernelagent.models.litellm_model import LitellmModel
from tests.fake_openai_server import FakeOpenAIServer, error, text, tool

# -- a tiny problem and candidates, written into tmp_path by the tests -------------------
RELU_PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(4096, 1000)]


def get_init_inputs():
    return []


def get_smoke_inputs():
    return [torch.randn(37, 1000)]
'''

GOOD = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 4096),)](x, y, n, BLOCK=4096)
        return y
'''.lstrip()

WRONG = GOOD.replace("tl.maximum(x, 0.0)", "x * 0.5")
SYNTAX_ERROR = GOOD.replace("def forward(self, x):", "def forward(self, x)")


def block(code: str, prose: str = "Here is my kernel.") -> str:
    return f"{prose}\n\n```python\n{code}```\n"


@pytest.fixture
def problem(tmp_path) -> Path:
    path = tmp_path / "19_ReLU.py"
    path.write_text(RELU_PROBLEM)
    return path


@pytest.fixture
def server():
    with FakeOpenAIServer() as srv:
        yield srv


def llm(server, **kw) -> LitellmModel:
    kw = {"timeout": 10.0, "max_retries": 4, "backoff_base": 0.01, "backoff_max": 0.1, **kw}
    return LitellmModel("openai/fake-coder", api_base=server.url, **kw)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


# == unit: budget ========================================================================
def test_budget_turn_limit_and_warnings():
    budget = Budget(max_turns=4)
    budget.check()
    budget.charge(10, 5, 0.01)
    budget.charge(10, 5, 0.01)
    assert budget.warning() is None  # 50%
    budget.charge(10, 5, 0.01)  # 75%, and the next turn is the last one
    warning = budget.warning()
    assert warning["last_turn"] is True and warning["turns_left"] == 1
    assert budget.warning() is None  # each warning once
    budget.check()
    budget.charge()
    with pytest.raises(LimitsExceeded, match="turns"):
        budget.check()
    assert budget.tokens == 45 and round(budget.cost, 6) == 0.03


@pytest.mark.parametrize("limit,charge,name", [({"max_tokens": 100}, (60, 40, 0.0), "tokens"),
                                               ({"max_cost": 0.5}, (0, 0, 0.5), "cost")])
def test_budget_token_and_cost_limits(limit, charge, name):
    budget = Budget(max_turns=100, **limit)
    budget.charge(*[c * 0.8 if isinstance(c, float) else int(c * 0.8) for c in charge])
    warning = budget.warning()
    assert warning["limit"] == name and warning["percent"] >= 75 and not warning["last_turn"]
    budget.charge(*charge)
    with pytest.raises(LimitsExceeded, match=name):
        budget.check()


def test_budget_wall_clock():
    budget = Budget(max_turns=10, timeout=5.0)
    budget.started -= 10
    with pytest.raises(LimitsExceeded, match="time"):
        budget.check()


# == unit: trajectory ====================================================================
def test_trajectory_is_written_atomically(tmp_path, monkeypatch):
    path = tmp_path / "run" / "trajectory.json"
    traj = Trajectory(path, config={"mode": "tools"}, environment={"torch": "x"})
    traj.add_message({"role": "user", "content": "hi"})
    traj.add_step({"turn": 1})
    data = load(path)
    assert data["format_version"] == 1 and data["status"] == "running"
    assert data["messages"] == [{"role": "user", "content": "hi"}] and data["steps"] == [{"turn": 1}]

    def broken_dump(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(trajectory_module.json, "dump", broken_dump)
    traj.add_message({"role": "user", "content": "lost"})
    with pytest.raises(OSError):
        traj.add_step({"turn": 2})
    # The old file is intact and no temp file is left behind.
    assert load(path)["steps"] == [{"turn": 1}]
    assert sorted(p.name for p in path.parent.iterdir()) == ["trajectory.json"]


# == unit: truncation, code extraction, target, prompts ===================================
def test_truncate_keeps_head_and_tail_and_says_so():
    assert truncate("short", 100, 10) == "short"
    text = "\n".join(f"line {i}" for i in range(1000))
    cut = truncate(text, max_chars=2000, max_lines=40)
    assert cut.startswith("line 0\n") and cut.endswith("line 999")
    assert "output cut: 960 lines" in cut and len(cut.splitlines()) == 41
    one_line = "x" * 50_000
    cut = truncate(one_line, max_chars=1000, max_lines=40)
    assert "output cut: 49000 characters" in cut and len(cut) < 1100


def test_extract_code_picks_the_last_modelnew_block():
    reply = ("Plan.\n```python\nimport torch\n```\nfirst:\n```python\nclass ModelNew: pass  # 1\n```\n"
             "better:\n```py\nclass ModelNew: pass  # 2\n```\n")
    assert extract_code(reply) == "class ModelNew: pass  # 2\n"
    assert extract_code("```\nclass ModelNew: pass\n```") == "class ModelNew: pass\n"
    with pytest.raises(FormatError) as info:
        extract_code("I think we should use tiling.")
    assert info.value.kind == "no_action"
    with pytest.raises(FormatError) as info:
        extract_code("```python\nclass ModelNew:\n    def forward(self")
    assert info.value.kind == "unclosed_block"


def test_check_target():
    cpu = Observation(text="", passed=True, timed=True, measurable=False, speedups={"eager": 0.01})
    assert check_target(cpu, 1.0) == (True, "not measurable on CPU")
    gpu = Observation(text="", passed=True, timed=True, measurable=True,
                      speedups={"eager": 3.0, "compile": 1.1})
    assert check_target(gpu, 1.0)[0] and not check_target(gpu, 1.5)[0]
    assert "TorchInductor" in check_target(gpu, 1.5)[1]
    eager_only = Observation(text="", passed=True, timed=True, measurable=True, speedups={"eager": 2.0})
    assert check_target(eager_only, 1.5) == (True, "2.000x vs eager (no TorchInductor baseline), "
                                                   "target 1.5x: met (point estimate: no interval measured)")
    assert not check_target(Observation(text="", passed=True), 1.0)[0]


def test_check_target_decides_on_the_lower_bound():
    # The point estimate beats 1.0, the interval's low end does not: not met.
    noisy = Observation(text="", passed=True, timed=True, measurable=True, speedups={"compile": 1.12},
                        intervals={"compile": [0.86, 1.30]})
    met, label = check_target(noisy, 1.0)
    assert not met
    assert "1.120x [0.860, 1.300]" in label and "lower bound" in label and "not met" in label
    # The whole interval is above the target: met.
    sure = Observation(text="", passed=True, timed=True, measurable=True, speedups={"compile": 1.12},
                       intervals={"compile": [1.05, 1.20]})
    assert check_target(sure, 1.0)[0] and not check_target(sure, 1.1)[0]
    # An interval for another baseline does not count for TorchInductor's decision.
    other = Observation(text="", passed=True, timed=True, measurable=True, speedups={"compile": 1.12, "eager": 3.0},
                        intervals={"eager": [2.9, 3.1]})
    assert check_target(other, 1.0) == (True, "1.120x vs TorchInductor, target 1x: met "
                                              "(point estimate: no interval measured)")


def test_prompts_render_and_are_found():
    prompts = Prompts()
    assert prompt_dirs(), "prompt templates not found"
    for mode in ("tools", "text", "auto"):
        system = prompts.render("system", mode=mode, backend="triton")
        assert "ModelNew" in system and "own Triton kernels" in system
        assert ("```python" in system) == (mode != "tools")
    task = prompts.render("task", mode="tools", backend="triton", problem_name="p",
                          reference_source="class Model: ...", device={"name": "NVIDIA H100",
                          "sm_count": 132, "l2_bytes": 50 * 2**20, "mem_bytes": None,
                          "mem_bandwidth_gbs": 3350.0, "peak_tflops": {"bfloat16": 989.0}},
                          inputs={"get_inputs": ["Tensor(shape=(4,), dtype=float32)"]},
                          cpu=False, target_speedup=1.2, max_turns=5, max_tokens=None,
                          max_cost=2.0, timeout=None)
    for expected in ("NVIDIA H100", "132 SMs", "3350 GB/s", "bfloat16 989.0", "1.2x",
                     "class Model: ...", "Tensor(shape=(4,)", "$2.0"):
        assert expected in task, expected
    assert "LAST turn" in prompts.render("budget_warning", mode="tools", last_turn=True)
    assert [s["function"]["name"] for s in TOOL_SCHEMAS] == TOOL_NAMES == [
        "read_reference", "compile", "run_tests", "profile", "submit"]


def test_describe_inputs_uses_meta_tensors(problem):
    info = describe_inputs(str(problem))
    assert info["get_inputs"] == ["Tensor(shape=(4096, 1000), dtype=float32)"]
    assert info["get_smoke_inputs"] == ["Tensor(shape=(37, 1000), dtype=float32)"]
    assert info["get_init_inputs"] == []


# == the loop's decisions, with a stand-in executor (no harness) ===========================
class FakeTools:
    """Verdicts by candidate text: 'fast' -> correct 2x, 'slow' -> correct 0.5x, else wrong."""

    def __init__(self, flaky: set[str] | None = None):
        self.flaky = flaky or set()
        self.verified: list[str] = []

    def schemas(self):
        return TOOL_SCHEMAS

    def _obs(self, code, full, submitted=False):
        speed = 2.0 if "fast" in code else 0.5 if "slow" in code else None
        return Observation(text=f"verdict for {code}", verdict="correct" if speed else "incorrect",
                           code=code, passed=speed is not None, timed=speed is not None,
                           measurable=True, speedups={"compile": speed} if speed else {},
                           full=full, submitted=submitted)

    def run(self, name, arguments):
        return self._obs(arguments.get("code", ""), name == "submit", name == "submit")

    def evaluate(self, code):
        return self._obs(code, False)

    def verify(self, code, *, audit=False):
        self.verified.append(code)
        obs = self._obs(code, True)
        if code in self.flaky:
            obs.passed, obs.verdict = False, "incorrect"
        return obs


class IntervalTools(FakeTools):
    """'noisy' -> point 1.12x, interval [0.9, 1.3]; 'sure' -> point 1.12x, interval [1.05, 1.2]."""

    def _obs(self, code, full, submitted=False):
        interval = [0.9, 1.3] if "noisy" in code else [1.05, 1.2] if "sure" in code else None
        if interval is None:
            return super()._obs(code, full, submitted)
        return Observation(text=f"verdict for {code}", verdict="correct", code=code, passed=True, timed=True,
                           measurable=True, speedups={"compile": 1.12}, intervals={"compile": interval},
                           full=full, submitted=submitted)


def run_loop(replies, tools=None, mode="auto", target=1.0, **budget):
    tools = tools or FakeTools()
    agent = Agent(ScriptedModel(replies), tools, Prompts(), Budget(**{"max_turns": 10, **budget}),
                  Trajectory(None), AgentConfig(mode=mode, target_speedup=target))
    return agent.run("system", "task"), agent, tools


def test_short_submit_is_pushed_back_once_then_accepted():
    result, agent, _ = run_loop([tool_reply("submit", {"code": "slow"}),
                                 tool_reply("submit", {"code": "slow"})], target=1.5)
    assert result.exit_code == 3 and result.outcome == "short_of_target"
    assert result.stop_reason == "submitted"
    pushed = [m for m in agent.messages if m["role"] == "tool"][0]["content"]
    assert "improve it and submit again" in pushed


def test_target_met_stops_and_fastest_is_kept():
    result, _, tools = run_loop([text_reply(block("slow\nclass ModelNew: ...\n")),
                                 text_reply(block("fast\nclass ModelNew: ...\n")),
                                 text_reply("never asked")], mode="text", target=1.5)
    assert result.exit_code == 0 and result.stop_reason == "target_met"
    assert "fast" in result.best.code and result.best.speedups["compile"] == 2.0
    assert len(tools.verified) == 1  # re-verified with the full trial count


def test_point_above_target_but_lower_bound_below_does_not_stop_the_run():
    result, agent, _ = run_loop([text_reply(block("noisy\nclass ModelNew: ...\n")),
                                 text_reply(block("sure\nclass ModelNew: ...\n")),
                                 text_reply("never asked")], tools=IntervalTools(), mode="text", target=1.0)
    # The first candidate (1.12x, lower bound 0.9) did not stop the loop; the second did.
    assert result.stop_reason == "target_met" and result.exit_code == 0
    assert "sure" in result.best.code and agent.budget.turns == 2
    assert "lower bound" in result.target_check


def test_lower_bound_short_of_target_is_short_of_target():
    result, _, _ = run_loop([tool_reply("submit", {"code": "noisy"}), tool_reply("submit", {"code": "noisy"})],
                            tools=IntervalTools(), target=1.0)
    assert result.outcome == "short_of_target" and result.exit_code == 3
    assert "[0.900, 1.300]" in result.target_check


def test_profile_and_submit_time_with_the_same_settings(problem):
    """Issue 13: `profile` and `submit` must time the candidate and its baselines the same way.
    Both configs come from tools.timed_settings; they may differ only in trials and in the
    profiler pass (after the timed loop), and they share the baseline cache key."""
    from kernelagent.harness.caller.baseline_cache import BaselineCache
    from kernelagent.harness.result import EvalResult
    from kernelagent.problem import load_problem

    class Recorder:
        def __init__(self):
            self.configs = []

        def evaluate(self, problem, code, config):
            self.configs.append(config)
            return EvalResult(status="incorrect")

    recorder = Recorder()
    tools = HarnessTools(recorder, load_problem(problem), Prompts(), trials=5, quick_trials=2,
                         eval_overrides={"compile_modes": ("default", "reduce-overhead")}, inputs={})
    for name in ("profile", "submit"):
        tools.run(name, {"code": "class ModelNew: pass"})
    tools.verify("class ModelNew: pass")
    tools.evaluate("class ModelNew: pass")
    profile_cfg, *others = recorder.configs
    assert profile_cfg.profile and profile_cfg.trials == 2
    for other in others:
        a, b = profile_cfg.to_dict(), other.to_dict()
        differing = {k for k in a if a[k] != b[k]}
        # audits (issue 55) change no timing: submit and the final verification audit a win
        assert differing <= {"trials", "profile", "audit_wins"}, differing
        assert other.timing and other.baselines and not other.profile
        fingerprint = {"gpu_name": "NVIDIA H200", "driver": "1", "torch": "2", "triton": "3", "python": "3.12"}
        cache = BaselineCache("/nonexistent")
        assert cache.key("p", fingerprint, profile_cfg) == cache.key("p", fingerprint, other)
    assert profile_cfg.compile_modes == ("default", "reduce-overhead")
    # who audits a win: what a person is shown (submit, the final verification), not every turn
    assert [c.audit_wins for c in recorder.configs] == [False, True, True, False]
    tools.verify("class ModelNew: pass", audit=True)
    assert recorder.configs[-1].audit and recorder.configs[-1].audit_wins


def test_final_verification_falls_back_to_next_best():
    result, _, tools = run_loop([tool_reply("profile", {"code": "fast one"}),
                                 tool_reply("profile", {"code": "slow one"})],
                                tools=FakeTools(flaky={"fast one"}), target=5.0, max_turns=2)
    assert tools.verified == ["fast one", "slow one"]
    assert result.best.code == "slow one" and result.exit_code == 3
    assert result.stop_reason == "limits"


def test_tools_mode_rejects_replies_without_tool_calls():
    result, agent, _ = run_loop([text_reply(block("fast\nclass ModelNew: ...\n"))], mode="tools",
                                max_turns=1)
    assert result.exit_code == 1
    assert "called no tool" in agent.messages[-1]["content"]


def test_budget_warning_reaches_the_model_and_tokens_stop_the_run():
    replies = [text_reply(block("wrong\nclass ModelNew: ...\n"), 400, 400) for _ in range(5)]
    result, agent, _ = run_loop(replies, mode="text", max_tokens=2000)
    assert result.stop_reason == "limits" and "tokens" in result.stop_detail
    assert agent.budget.turns == 3
    warnings = [m["content"] for m in agent.messages if m["content"].startswith("Budget warning")]
    assert len(warnings) == 1 and "tokens budget" in warnings[0]


# == whole runs: real litellm client -> fake server; real harness =========================
def test_tool_calling_run_fix_until_correct(server, problem, tmp_path, evaluator):
    """Required 1 (library level): compile error, then wrong, then correct -> success."""
    server.add(tool("read_reference"), tool("compile", {"code": SYNTAX_ERROR}),
               tool("run_tests", {"code": WRONG}), tool("run_tests", {"code": GOOD}),
               tool("submit"))
    out = tmp_path / "out"
    run = optimize(problem, llm(server), mode="tools", out=out, evaluator=evaluator, max_turns=8)
    assert run.exit_code == 0, run.summary
    assert (out / "kernel.py").read_text() == GOOD
    traj = load(out / "trajectory.json")
    assert traj["status"] == "finished" and traj["format_version"] == 1
    verdicts = [o["verdict"] for s in traj["steps"] for o in s["observations"]]
    assert verdicts == ["ok", "compile_error", "incorrect", "correct", "correct"]
    tools_seen = [m for m in traj["messages"] if m["role"] == "tool"]
    assert "Tensor(shape=(4096, 1000), dtype=float32)" in tools_seen[0]["content"]
    assert "syntax error" in tools_seen[1]["content"]
    assert "output mismatch" in tools_seen[2]["content"]
    assert "submission verified" in tools_seen[4]["content"]
    # submit without code took the last candidate; every step records tokens and latency.
    assert all(s["model"]["usage"]["total_tokens"] == 120 for s in traj["steps"])
    assert traj["steps"][-1]["observations"][0]["harness"]["status"] == "correct"
    assert traj["environment"]["torch"] and traj["config"]["model"]["name"] == "openai/fake-coder"
    # The model saw real tool results, paired with its tool-call ids.
    last_request = server.requests[-1]["messages"]
    assert [m["role"] for m in last_request[:3]] == ["system", "user", "assistant"]
    assert last_request[3]["role"] == "tool" and last_request[3]["tool_call_id"]
    summary = load(out / "summary.json")
    assert summary["outcome"] == "success" and summary["target_check"] == "not measurable on CPU"
    assert summary["turns"] == 5 and summary["tokens"]["total"] == 600
    assert summary["tool_calls"] == {"read_reference": 1, "compile": 1, "run_tests": 2, "submit": 1}
    assert set(summary["tool_time_s"]) >= {"compile", "run_tests", "submit"}


def test_text_only_run(server, problem, tmp_path, evaluator):
    """Required 2 (library level): code blocks only, never tool calls."""
    server.add(text(block(SYNTAX_ERROR)), text(block(WRONG)), text("Let me think about it."),
               text(block(GOOD)))
    out = tmp_path / "out"
    run = optimize(problem, llm(server), mode="text", out=out, evaluator=evaluator, max_turns=6)
    assert run.exit_code == 0 and (out / "kernel.py").read_text() == GOOD
    assert all("tools" not in body for body in server.requests)
    users = [m["content"] for m in load(out / "trajectory.json")["messages"] if m["role"] == "user"]
    assert "compile_error" in users[1] and "output mismatch" in users[2]
    assert "had no candidate" in users[3]
    assert run.summary["tool_calls"] == {"evaluate": 3}


def test_faults_are_retried_and_bad_arguments_reported(server, problem, tmp_path, evaluator):
    """Required 4: 429, 500 and a client timeout are retried; malformed tool-call arguments
    go back to the model as an error and the run completes."""
    server.add(error(429, retry_after="0"), tool("compile", "{\"code\": \"unterminated"),
               error(500), {"delay": 2.0, "content": "too late"},
               tool("submit", {"code": GOOD}))
    out = tmp_path / "out"
    run = optimize(problem, llm(server, timeout=0.7), mode="auto", out=out,
                   evaluator=evaluator, max_turns=5)
    assert run.exit_code == 0
    assert len(server.requests) == 5  # 2 model turns, 3 failed attempts retried
    retried = server.requests[-1]["messages"]
    bad = [m for m in retried if m["role"] == "tool"][0]
    assert "not valid JSON" in bad["content"]
    # The assistant turn sent back carries {} in place of the unparseable arguments...
    sent = [m for m in retried if m.get("tool_calls")][0]
    assert sent["tool_calls"][0]["function"]["arguments"] == "{}"
    # ...and the trajectory keeps what the model really sent.
    traj = load(out / "trajectory.json")
    assert traj["steps"][0]["observations"][0]["arguments_json"] == "{\"code\": \"unterminated"
    assert traj["steps"][0]["observations"][0]["verdict"] == "bad_arguments"


def test_bad_problem_at_run_time_is_a_user_error(server, tmp_path, evaluator):
    from kernelagent.errors import UserError

    path = tmp_path / "broken.py"
    path.write_text(RELU_PROBLEM.replace("return [torch.randn(37, 1000)]",
                                         "raise RuntimeError('no inputs')"))
    server.add(tool("run_tests", {"code": GOOD}))
    with pytest.raises(UserError):
        optimize(path, llm(server), mode="tools", out=tmp_path / "out", evaluator=evaluator)
    assert load(tmp_path / "out" / "trajectory.json")["status"] == "error"


def test_env_does_not_leak_keys_into_trajectory(server, problem, tmp_path, evaluator, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-value")
    server.add(tool("submit", {"code": GOOD}))
    out = tmp_path / "out"
    optimize(problem, llm(server, api_key="sk-secret-value"), mode="tools", out=out,
             evaluator=evaluator, max_turns=2)
    assert "sk-secret-value" not in (out / "trajectory.json").read_text()
    assert os.environ["OPENAI_API_KEY"] == "sk-secret-value"


@pytest.mark.parametrize("arguments", ["[" * 200_000 + "]" * 200_000, '{"code": "x", "n": ' + str(10**400) + "}"],
                         ids=["deep", "huge-int"])
def test_unbounded_tool_arguments_go_back_to_the_model_as_an_error(arguments):
    """Issue 54, class 5: the model's tool-call arguments are parsed bounded (harness/bounded_json.py);
    200,000 nested arrays raised RecursionError out of the agent's turn."""
    from types import SimpleNamespace

    from kernelagent.agent.loop import Agent

    ran = []
    agent = SimpleNamespace(tools=SimpleNamespace(run=lambda name, args: ran.append(args)),
                            format_error=lambda exc: f"error: {exc}")
    obs = Agent.call_tool(agent, "compile", arguments)
    assert obs.verdict == "bad_arguments" and "not valid JSON" in obs.text and not ran
    reply = SimpleNamespace(to_message=lambda: {"role": "assistant", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "compile", "arguments": arguments}}]})
    assert Agent.history_message(agent, reply)["tool_calls"][0]["function"]["arguments"] == "{}"
