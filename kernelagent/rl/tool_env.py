"""A multi-turn environment in the shape TRL's `GRPOTrainer(environment_factory=...)` takes.

    from kernelagent.rl import KernelToolEnv
    factory = KernelToolEnv.factory(devices=["cuda:7"], max_turns=10)   # or backend=pool
    trainer = GRPOTrainer(model=..., environment_factory=factory, train_dataset=prompts, ...)

TRL's contract (trl 1.x): the factory is called with no arguments; every public method of the
class other than `reset` and `get_reward` becomes a tool (its name, type hints and docstring
make the schema); `reset(**row)` is called with the dataset row before each rollout and may
return a string that is appended to the last user message; `get_reward()` is called once the
rollout ends and scores it from the environment's state.

So the tools here are the agent's own (`read_reference`, `compile`, `run_tests`, `profile`,
`submit`), run by the same `HarnessTools` and judged by the same rules as `optimize`
(a correct submission, or a correct kernel that meets the target, ends the episode; the
final verification re-checks the best kernel with the full trial count). The reward is
`reward_from_result` of the verified best kernel, as in `KernelEnv`. `finish()` ends an
episode the trainer cut short; it is set on the instance, not defined on the class, so TRL
does not offer it to the model as a tool.

The dataset is `kernelagent dataset prompts DIR --mode tools` (its rows carry the prompt
and the problem columns); `reset` then adds nothing to the prompt. Rows without a `prompt`
get the system and task prompts back from `reset`, rendered from the same templates.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from typing import TYPE_CHECKING, Any

from kernelagent.rl.reward import RewardBreakdown, RewardConfig, reward_from_result

if TYPE_CHECKING:
    from kernelagent.harness import FingerprintedEvaluator

_shared_lock = threading.Lock()
_shared: dict[tuple, Any] = {}


def shared_backend(devices: list[str] | None = None, cpu_workers: int = 1,
                   isolation: str = "auto", cache_dir: str | None = None) -> Any:
    """One EvaluatorPool per device list for all environments of a process (TRL builds one
    environment per rollout). The devices follow KernelReward's rule."""
    from kernelagent.rl.trl import default_backend_args

    devices = default_backend_args(devices, cpu_workers)
    key = (tuple(devices), isolation, cache_dir)
    with _shared_lock:
        if key not in _shared:
            from kernelagent.harness.caller.pool import EvaluatorPool

            _shared[key] = EvaluatorPool(devices=devices, cache_dir=cache_dir, isolation=isolation,
                                         cpu_workers=cpu_workers)
        return _shared[key]


class KernelToolEnv:
    """One rollout's environment: the agent's tools over the harness, and its reward."""

    def __init__(self, backend: FingerprintedEvaluator | None = None, *, devices: list[str] | None = None,
                 max_turns: int = 10, target_speedup: float = 1.0, trials: int = 5,
                 quick_trials: int = 2, eval_overrides: dict[str, Any] | None = None,
                 reward_config: RewardConfig | None = None, mode: str = "tools") -> None:
        self.backend = backend if backend is not None else shared_backend(devices)
        self.max_turns, self.target_speedup = max_turns, target_speedup
        self.trials, self.quick_trials = trials, min(quick_trials, trials)
        self.eval_overrides = dict(eval_overrides or {})
        self.reward_config = reward_config or RewardConfig()
        self.mode = mode
        self.agent: Any = None
        self.problem: Any = None
        self.done = True
        self.final: RewardBreakdown | None = None
        self.run_result: Any = None
        self.calls: list[dict[str, Any]] = []  # (tool, verdict, passed, seconds) per call
        self._data: list[dict] = []  # the harness verdicts of this episode
        # Public but not a class attribute: TRL lists tools from the class's functions.
        self.finish = self._finish

    @classmethod
    def factory(cls, **options: Any) -> Any:
        """A zero-argument callable for `environment_factory` (options as for __init__)."""
        return functools.partial(cls, **options)

    # -- TRL hooks ---------------------------------------------------------------------
    def reset(self, **row: Any) -> str | None:
        """Start a rollout on the row's problem (`problem_source`, else `problem_path`)."""
        from kernelagent.agent import BACKEND, Budget, Prompts, first_messages, start_episode
        from kernelagent.rl.env import as_problem, fingerprint_of
        from kernelagent.rl.facts import inputs_for

        if self.agent is not None and not self.done:
            self._finish("reset")
        source = row.get("problem_source") or row.get("problem_path") or row.get("problem")
        if not source:
            raise ValueError("the dataset row has no problem: it needs `problem_source` or "
                             "`problem_path` (kernelagent dataset prompts writes both)")
        problem = as_problem(source, row.get("problem_id"))
        prompts = self._prompts = getattr(self, "_prompts", None) or Prompts()
        inputs = inputs_for(problem)
        budget = Budget(max_turns=self.max_turns)
        episode = start_episode(model=None, evaluator=self.backend, problem=problem, prompts=prompts, budget=budget,
                                mode=self.mode, trials=self.trials, quick_trials=self.quick_trials,
                                target_speedup=self.target_speedup, eval_overrides=self.eval_overrides,
                                inputs=inputs, trajectory_path=None,
                                record={"mode": self.mode, "source": "kernelagent.rl.tool_env",
                                        "max_turns": self.max_turns}, environment={}, backend=BACKEND)
        self.agent = episode.agent
        self.problem, self.tools = problem, episode.tools
        self.done, self.final, self.run_result, self.calls, self._data = False, None, None, [], []
        budget.started = time.monotonic()
        if row.get("prompt"):
            return None  # the dataset's prompt is already the task
        system, task = first_messages(prompts, episode.context(fingerprint_of(self.backend)))
        return system["content"] + "\n\n" + task["content"]

    def get_reward(self) -> float | None:
        """The rollout's reward (None for an infrastructure failure): ends the episode."""
        return self._finish("rollout_ended").value

    # -- tools (every public function below is offered to the model) -------------------
    def read_reference(self) -> str:
        """Show the reference PyTorch problem: its source, and the shapes and dtypes of its inputs.

        Returns:
            The reference source and input descriptions.
        """
        return self._tool("read_reference", {})

    def compile(self, code: str | None = None) -> str:
        """Load the candidate and run its first forward call (kernels compile here). Reports import,
        syntax and compile errors compactly. No correctness check.

        Args:
            code: The complete Python module defining `class ModelNew(nn.Module)` and its kernels. Leave out to reuse your most recent candidate.

        Returns:
            The harness's verdict.
        """
        return self._tool("compile", {"code": code})

    def run_tests(self, code: str | None = None) -> str:
        """Check the candidate's outputs against the reference on several random inputs; reports each trial.

        Args:
            code: The complete Python module defining `class ModelNew(nn.Module)` and its kernels. Leave out to reuse your most recent candidate.

        Returns:
            The harness's verdict, trial by trial.
        """
        return self._tool("run_tests", {"code": code})

    def profile(self, code: str | None = None) -> str:
        """Time the candidate against eager PyTorch and TorchInductor and list its top kernels.

        Args:
            code: The complete Python module defining `class ModelNew(nn.Module)` and its kernels. Leave out to reuse your most recent candidate.

        Returns:
            Timings, speedups and the top kernels.
        """
        return self._tool("profile", {"code": code})

    def submit(self, code: str | None = None) -> str:
        """Submit the candidate as the final answer: verified with the full number of trials and timed; if it passes, the episode ends.

        Args:
            code: The complete Python module defining `class ModelNew(nn.Module)` and its kernels. Leave out to reuse your most recent candidate.

        Returns:
            The harness's verdict.
        """
        return self._tool("submit", {"code": code})

    # -- internals ---------------------------------------------------------------------
    def _tool(self, name: str, arguments: dict[str, Any]) -> str:
        from kernelagent.agent import LimitsExceeded

        if self.agent is None:
            return "No episode is running."
        if self.done:
            return "The episode has ended; answer without calling tools."
        agent = self.agent
        try:
            agent.budget.check()
        except LimitsExceeded as exc:
            self._finish("limits")
            return f"The budget is spent ({exc}); the episode has ended."
        agent.budget.charge()  # one tool call is one turn of the budget
        args = {k: v for k, v in arguments.items() if v is not None}
        obs = agent.call_tool(name, json.dumps(args))
        stop = agent.judge(obs, agent.budget.turns)
        agent.count(name, obs)
        self.calls.append({"tool": name, "verdict": obs.verdict, "passed": obs.passed,
                           "seconds": round(obs.seconds, 3)})
        if obs.data:
            self._data.append(obs.data)
        text = agent.cut(obs.text)
        if stop:
            self._finish(stop[0])
            text += f"\n\nThe episode has ended: {stop[1]}."
        return text

    def _finish(self, reason: str = "cut_short") -> RewardBreakdown:
        """End the episode (final verification of the best kernel) and return its reward."""
        if self.agent is None:
            raise RuntimeError("no episode: reset() was never called")
        if not self.done:
            self.run_result = self.agent.finish(reason, "")
            self.done = True
            self.final = self._terminal()
        assert self.final is not None
        return self.final

    def _terminal(self) -> RewardBreakdown:
        best = self.run_result.best if self.run_result else None
        if best is not None and best.data:
            return reward_from_result(best.data, self.reward_config)
        seen = [reward_from_result(data, self.reward_config) for data in self._data]
        ran = [b for b in seen if not b.infra_error]
        if any(b.compiled for b in ran):
            # Nothing survived the final verification: at most the compile credit.
            cfg = self.reward_config
            return RewardBreakdown(reward=cfg.compile_weight, verifiable=cfg.compile_weight,
                                   status="no_verified_kernel", compiled=True,
                                   compile_term=cfg.compile_weight,
                                   notes=["no kernel passed the final verification: compile credit only"])
        if seen and not ran:
            return RewardBreakdown(reward=0.0, verifiable=0.0, status="infra_error", infra_error=True,
                                   notes=["every evaluation failed in the harness: no reward"])
        return RewardBreakdown(reward=0.0, verifiable=0.0, status="no_candidate",
                               notes=["the episode evaluated no candidate"])
