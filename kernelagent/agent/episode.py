"""One agent episode, set up in one place: the tools over an evaluator, the trajectory, the
loop, and the prompt context its first messages are rendered from.

`kernelagent optimize` (orchestrate/run.py), the RL environments (rl/env.py's KernelEnv,
rl/tool_env.py's KernelToolEnv) and the prompt datasets (rl/dataset.py) all start here, so a
model sees the same tools, rules and prompts wherever it runs.

    episode = start_episode(model=model, evaluator=evaluator, problem=problem, prompts=Prompts(),
                            budget=Budget(max_turns=10), mode="tools", trials=5, quick_trials=2,
                            target_speedup=1.0, eval_overrides={}, inputs=inputs,
                            trajectory_path=None, record={}, environment={})
    context = episode.context(evaluator.fingerprint())
    messages = first_messages(episode.prompts, context)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from kernelagent.agent.budget import Budget
from kernelagent.agent.loop import Agent, AgentConfig
from kernelagent.agent.prompts import Prompts
from kernelagent.agent.tools import HarnessTools
from kernelagent.agent.trajectory import Trajectory

if TYPE_CHECKING:
    from kernelagent.models.base import Model
    from kernelagent.harness import EvaluatorProtocol

DEFAULT_BACKEND = "triton"


@dataclass
class Episode:
    """The pieces of one episode, wired together."""

    problem: Any
    prompts: Prompts
    tools: HarnessTools
    budget: Budget
    trajectory: Trajectory
    agent: Agent
    mode: str
    backend: str
    target_speedup: float

    def context(self, fingerprint: dict[str, Any]) -> dict[str, Any]:
        """The variables the system and task prompts are rendered with, on the machine that
        `fingerprint` (the evaluator's) names."""
        from kernelagent.agent import describe, prompt_context

        budget = self.budget
        return prompt_context(self.problem, mode=self.mode, backend=self.backend, inputs=self.tools.inputs,
                              device=describe(fingerprint), cpu=not fingerprint.get("cuda"),
                              target_speedup=self.target_speedup, max_turns=budget.max_turns,
                              max_tokens=budget.max_tokens, max_cost=budget.max_cost, timeout=budget.timeout)


def first_messages(prompts: Prompts, context: dict[str, Any]) -> list[dict[str, str]]:
    """[system, user]: the messages an episode starts with."""
    return [{"role": "system", "content": prompts.render("system", **context)},
            {"role": "user", "content": prompts.render("task", **context)}]


def start_episode(*, model: Model, evaluator: EvaluatorProtocol | None, problem: Any, prompts: Prompts,
                  budget: Budget, mode: str, trials: int, quick_trials: int, target_speedup: float,
                  eval_overrides: dict[str, Any] | None, inputs: dict[str, Any] | None,
                  trajectory_path: str | Path | None, record: dict[str, Any], environment: dict[str, Any],
                  backend: str = DEFAULT_BACKEND, observer: Callable[..., None] | None = None) -> Episode:
    """The tools (HarnessTools over `evaluator`, with `eval_overrides` and the backend), the
    trajectory (`record`: the run's settings; `environment`: the machine) and the loop. Nothing
    is evaluated or rendered here."""
    overrides = dict(eval_overrides or {})
    if backend != DEFAULT_BACKEND:
        overrides["backend"] = backend
    trajectory = Trajectory(trajectory_path, config=record, environment=environment,
                            problem={"name": problem.name, "path": str(problem.path), "sha256": problem.sha256})
    tools = HarnessTools(evaluator, problem, prompts, trials=trials, quick_trials=quick_trials,
                         target_speedup=target_speedup, eval_overrides=overrides, inputs=inputs)
    agent = Agent(model, tools, prompts, budget, trajectory, AgentConfig(mode=mode, target_speedup=target_speedup),
                  observer=observer)
    return Episode(problem=problem, prompts=prompts, tools=tools, budget=budget, trajectory=trajectory, agent=agent,
                   mode=mode, backend=backend, target_speedup=target_speedup)
