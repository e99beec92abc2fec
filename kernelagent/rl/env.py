"""A multi-turn environment over the agent's own loop, tools and prompts.

    env = KernelEnv(pool, mode="tools")
    messages = env.reset("benchmarks/level1/1_relu.py")   # [system, task], as optimize sends
    obs, reward, done = env.step(policy(messages, env.tools_schema))   # ... until done

`step(action)` hands the policy's reply to the same `Agent.step` that `kernelagent optimize`
runs: the action is an assistant reply (a string in text/auto mode, or an assistant message
dict with OpenAI `tool_calls`, or a ModelReply), the tools are `HarnessTools`, the feedback
is rendered from the same templates, the budget warnings, format errors, short-submit push
back and stopping rules are the loop's. `env.messages` is the conversation exactly as the
model would see it next. When the episode ends (a correct kernel meets the target, a
correct one is submitted, or the turn budget is spent) the loop's final verification runs
and the terminal reward is `reward_from_result` of the verified best kernel; with none, the
best reward any evaluation in the episode earned (compile credit, at most).

`reward_mode="terminal"` (default) gives 0 on intermediate steps; `"per_step"` gives each
step the reward of the evaluations it ran (their maximum), and the terminal reward at the end.
`finish()` ends an episode the trainer cut short (the final verification runs; the terminal
reward is returned).

A warm `reset` costs milliseconds: the problem's input facts are cached by content hash
(kernelagent.rl.facts) and the evaluator's fingerprint once per evaluator, so no torch
import happens per reset.

Three more shapes of the same episode:
- `KernelGymEnv`: gymnasium-style `reset(seed, options) -> (obs, info)` and
  `step(action) -> (obs, reward, terminated, truncated, info)`;
- `KernelToolEnv`: a class TRL's `GRPOTrainer(environment_factory=...)` uses as it is
  (kernelagent.rl.tool_env);
- `kernelagent.rl.verifiers_env`: an adapter for verifiers' 0.1.x `MultiTurnEnv`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelagent.rl.reward import RewardBreakdown, RewardConfig, reward_from_result

if TYPE_CHECKING:
    from kernelagent.harness import FingerprintedEvaluator

_fingerprints: dict[int, tuple[Any, dict]] = {}


def fingerprint_of(evaluator: FingerprintedEvaluator) -> dict:
    """The evaluator's fingerprint, asked once per evaluator (a pool's `fingerprint` waits
    for a free evaluator: a reset must not queue behind running evaluations)."""
    hit = _fingerprints.get(id(evaluator))
    if hit is not None and hit[0] is evaluator:
        return hit[1]
    fingerprint = evaluator.fingerprint()
    _fingerprints[id(evaluator)] = (evaluator, fingerprint)
    return fingerprint


def as_problem(problem: Any, problem_id: str | None = None) -> Any:
    """A Problem from a Problem, a path, or source text (with `problem_id`)."""
    from kernelagent.problem import Problem
    from kernelagent.rl.problems import resolve_problem

    if isinstance(problem, Problem):
        return problem
    text = str(problem)
    return (resolve_problem(source=text, problem_id=problem_id) if "\n" in text
            else resolve_problem(path=text))


class _ActionModel:
    """A Model whose next reply is the policy's action (set by `KernelEnv.step`)."""

    name = "policy"

    def __init__(self) -> None:
        self.pending: Any = None

    def query(self, messages: list[dict], tools: list[dict] | None = None) -> Any:
        reply, self.pending = self.pending, None
        if reply is None:
            from kernelagent.models.base import ModelError

            raise ModelError("no action given")
        return reply


def to_reply(action: Any, usage: dict | None = None) -> Any:
    """A ModelReply from a string, an assistant message dict, or a ModelReply."""
    from kernelagent.models.base import ModelReply, ToolCall, Usage

    if isinstance(action, ModelReply):
        return action
    u = Usage(**(usage or {}))
    if isinstance(action, str):
        return ModelReply(content=action, usage=u, cost_known=True)
    if isinstance(action, dict):
        calls = []
        for i, call in enumerate(action.get("tool_calls") or []):
            fn = call.get("function") or call
            args = fn.get("arguments", fn.get("arguments_json", "{}"))
            if not isinstance(args, str):
                args = json.dumps(args)
            calls.append(ToolCall(id=call.get("id") or f"call_{i}", name=fn.get("name", ""),
                                  arguments_json=args))
        return ModelReply(content=action.get("content") or "", tool_calls=calls, usage=u,
                          cost_known=True)
    raise TypeError(f"an action is a string, an assistant message dict or a ModelReply, not {type(action).__name__}")


class KernelEnv:
    """`reset(problem) -> prompt messages`; `step(action) -> (observation, reward, done)`.

    `evaluator`: an Evaluator or EvaluatorPool (anything with `.evaluate` and
    `.fingerprint`), shared between environments; it is not closed here."""

    def __init__(self, evaluator: FingerprintedEvaluator, *, mode: str = "auto", max_turns: int = 10,
                 target_speedup: float = 1.0, trials: int = 5, quick_trials: int = 2,
                 eval_overrides: dict[str, Any] | None = None,
                 reward_config: RewardConfig | None = None, reward_mode: str = "terminal",
                 out_dir: str | Path | None = None) -> None:
        if mode not in ("tools", "text", "auto"):
            raise ValueError("mode must be tools, text or auto")
        if reward_mode not in ("terminal", "per_step"):
            raise ValueError("reward_mode must be terminal or per_step")
        self.evaluator = evaluator
        self.mode, self.max_turns, self.target_speedup = mode, max_turns, target_speedup
        self.trials, self.quick_trials = trials, min(quick_trials, trials)
        self.eval_overrides = dict(eval_overrides or {})
        self.reward_config = reward_config or RewardConfig()
        self.reward_mode = reward_mode
        self.out_dir = Path(out_dir) if out_dir else None
        self.agent: Any = None
        self.done = True
        self.final: RewardBreakdown | None = None
        self.run_result: Any = None
        self._best_seen: RewardBreakdown | None = None

    # -- episode -----------------------------------------------------------------------
    def reset(self, problem: Any, *, problem_id: str | None = None) -> list[dict]:
        """Start an episode on `problem` (a path, a Problem, or source text with
        `problem_id`). Returns the prompt: the system and task messages."""
        from kernelagent.agent import BACKEND, Budget, Prompts, describe, first_messages, start_episode
        from kernelagent.rl.facts import inputs_for

        if self.agent is not None and not self.done:
            self.finish("reset")  # the previous episode was cut short
        problem = as_problem(problem, problem_id)
        prompts = self._prompts = getattr(self, "_prompts", None) or Prompts()
        inputs = inputs_for(problem)
        fingerprint = fingerprint_of(self.evaluator)
        device_info = describe(fingerprint)
        budget = Budget(max_turns=self.max_turns)
        config = {"mode": self.mode, "backend": BACKEND, "target_speedup": self.target_speedup,
                  "max_turns": self.max_turns, "trials": self.trials,
                  "quick_trials": self.quick_trials, "eval_overrides": self.eval_overrides,
                  "model": {"name": "policy"}, "source": "kernelagent.rl.env"}
        self._model = _ActionModel()
        path = self.out_dir / "trajectory.json" if self.out_dir else None
        # The same episode, and prompt context, as `kernelagent.orchestrate.optimize`'s.
        episode = start_episode(model=self._model, evaluator=self.evaluator, problem=problem, prompts=prompts,
                                budget=budget, mode=self.mode, trials=self.trials, quick_trials=self.quick_trials,
                                target_speedup=self.target_speedup, eval_overrides=self.eval_overrides,
                                inputs=inputs, trajectory_path=path, record=config,
                                environment={**fingerprint, "device_info": device_info}, backend=BACKEND)
        self.agent = episode.agent
        self.problem, self.tools, self.prompts = problem, episode.tools, prompts
        for message in first_messages(prompts, episode.context(fingerprint)):
            self.agent.add(message["role"], message["content"])
        episode.trajectory.save()
        budget.started = time.monotonic()
        self.done, self.final, self.run_result, self._best_seen = False, None, None, None
        return [dict(m) for m in self.agent.messages]

    def finish(self, reason: str = "cut_short") -> RewardBreakdown:
        """End the episode now (the trainer cut it short, or it is being dropped): the
        loop's final verification runs and the terminal reward is returned. Idempotent."""
        if self.agent is None:
            raise RuntimeError("no episode: call reset() first")
        if not self.done:
            self.run_result = self.agent.finish(reason, "the episode was ended by the caller")
            self.agent.trajectory.finish("finished", {"outcome": self.run_result.outcome,
                                                      "stop_reason": reason})
            self.done = True
            self.final = self._terminal()
        return self.final

    @property
    def messages(self) -> list[dict]:
        return [dict(m) for m in self.agent.messages] if self.agent else []

    @property
    def tools_schema(self) -> list[dict] | None:
        """Function-calling schemas to give the policy (None in text mode)."""
        return None if self.mode == "text" or self.agent is None else self.tools.schemas()

    def step(self, action: Any, usage: dict | None = None) -> tuple[str, float, bool]:
        """Apply one policy reply. Returns (observation text, reward, done)."""
        from kernelagent.agent import LimitsExceeded, Submitted

        if self.agent is None or self.done:
            raise RuntimeError("call reset() before step(), and again after an episode ends")
        self._model.pending = to_reply(action, usage)
        before = len(self.agent.messages)
        steps_before = len(self.agent.trajectory.steps)
        stop = None
        try:
            self.agent.step()
        except Submitted as exc:
            stop = (exc.reason, str(exc))
        except LimitsExceeded as exc:  # the budget was spent before this step
            stop = ("limits", str(exc))
        if stop is None:
            try:
                self.agent.budget.check()
            except LimitsExceeded as exc:
                stop = ("limits", str(exc))
        new = self.agent.messages[before:]
        observation = "\n\n".join(str(m.get("content") or "") for m in new
                                  if m.get("role") in ("user", "tool"))
        step_reward = self._step_reward(self.agent.trajectory.steps[steps_before:])
        if stop is None:
            return observation, (step_reward if self.reward_mode == "per_step" else 0.0), False
        self.run_result = self.agent.finish(*stop)
        self.agent.trajectory.finish("finished", {"outcome": self.run_result.outcome,
                                                  "stop_reason": stop[0]})
        self.done = True
        self.final = self._terminal()
        return observation, self.final.value or 0.0, True

    # -- rewards -----------------------------------------------------------------------
    def _step_reward(self, steps: list[dict]) -> float:
        best = None
        for step in steps:
            for obs in step.get("observations", []):
                if not obs.get("harness"):
                    continue
                breakdown = reward_from_result(obs["harness"], self.reward_config)
                if breakdown.infra_error:
                    continue
                if best is None or breakdown.reward > best.reward:
                    best = breakdown
        if best is not None and (self._best_seen is None or best.reward > self._best_seen.reward):
            self._best_seen = best
        return best.reward if best else 0.0

    def _terminal(self) -> RewardBreakdown:
        best = self.run_result.best if self.run_result else None
        if best is not None and best.data:
            return reward_from_result(best.data, self.reward_config)
        seen = self._best_seen
        if seen is not None and seen.compiled:
            # Nothing survived the final verification: at most the compile credit (a quick
            # check that passed and a full one that did not must not earn more).
            cfg = self.reward_config
            return RewardBreakdown(reward=cfg.compile_weight, verifiable=cfg.compile_weight,
                                   status="no_verified_kernel", compiled=True,
                                   compile_term=cfg.compile_weight,
                                   notes=["no kernel passed the final verification: compile credit only"])
        return RewardBreakdown(reward=0.0, verifiable=0.0, status="no_candidate",
                               notes=["the episode evaluated no candidate"])


class KernelGymEnv:
    """Gymnasium-style wrapper over `KernelEnv` (duck-typed: gymnasium is not needed).

        env = KernelGymEnv(pool, problems=["benchmarks/level1/1_relu.py", ...], mode="text")
        obs, info = env.reset(seed=0)                       # obs: the messages so far
        obs, reward, terminated, truncated, info = env.step(reply)

    `reset(seed, options)`: `options={"problem": path_or_source, "problem_id": ...}` picks
    the problem; otherwise one of `problems` is drawn with the seeded generator (the seed
    re-seeds it, as gymnasium does). `terminated`: a correct kernel ended the episode;
    `truncated`: the budget ran out. `info` carries the reward breakdown at the end.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, evaluator: FingerprintedEvaluator, problems: list[Any] | None = None,
                 **env_options: Any) -> None:
        import random

        self.env = KernelEnv(evaluator, **env_options)
        self.problems = list(problems or [])
        self._rng = random.Random()

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[list[dict], dict[str, Any]]:
        if seed is not None:
            self._rng.seed(seed)
        options = dict(options or {})
        problem = options.get("problem") or options.get("problem_source") or options.get("problem_path")
        if problem is None:
            if not self.problems:
                raise ValueError("no problem: pass options={'problem': ...} or problems=[...]")
            problem = self.problems[self._rng.randrange(len(self.problems))]
        messages = self.env.reset(problem, problem_id=options.get("problem_id"))
        return messages, {"problem": self.env.problem.display, "tools": self.env.tools_schema}

    def step(self, action: Any) -> tuple[list[dict], float, bool, bool, dict[str, Any]]:
        observation, reward, done = self.env.step(action)
        info: dict[str, Any] = {"observation": observation}
        terminated = truncated = False
        if done:
            result = self.env.run_result
            truncated = result is not None and result.stop_reason == "limits"
            terminated = not truncated
            info["reward"] = self.env.final.to_dict() if self.env.final else None
            info["outcome"] = result.outcome if result else None
        return self.env.messages, reward, terminated, truncated, info

    def finish(self) -> RewardBreakdown:
        """End an episode cut short (see KernelEnv.finish)."""
        return self.env.finish()

    def close(self) -> None:
        if self.env.agent is not None and not self.env.done:
            self.env.finish("closed")
