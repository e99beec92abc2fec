"""`KernelEnv` episodes inside the `verifiers` library (its 0.1.x `MultiTurnEnv` API).

    from kernelagent.rl.verifiers_env import load_environment
    env = load_environment(pool, dataset=rows, mode="tools", max_turns=10)   # a vf.MultiTurnEnv

Why 0.1.x and not 0.4: verifiers 0.4 dropped `MultiTurnEnv` for a different stack
(`verifiers.v1`: a Taskset of Tasks, a Harness *program* launched in a Runtime, tools as MCP
servers, the model reached through an interception proxy). Even its tool-less `null`
harness bootstraps its chat program with `uv sync --script` and network access, so an
episode cannot be stepped in-process, nor tested offline. 0.1.x keeps the in-process loop
that KernelEnv fits: `setup_state(state)` starts the episode, `env_response(messages,
state)` answers each model reply, a stop condition ends it, a Rubric scores it.

The glue lives in `KernelEpisodes`, which does not import verifiers (so it is tested
without it, and importing kernelagent never imports verifiers); the `MultiTurnEnv` subclass
is built on first use by `verifiers_env_class()`. Each rollout owns one `KernelEnv` (kept
in `state["kernel_env"]`): its `step` runs the agent's loop and tools, and the rubric's one
reward function is `KernelEnv.finish()`'s terminal reward (`reward_from_result` of the
verified best kernel). A reply that verifiers' own `max_turns` stop left unanswered is
stepped before scoring, so the last kernel is never lost.

Dataset rows are `kernelagent dataset prompts` rows: `prompt`, plus the problem in `info`
(`problem_source` or `problem_path`, and `problem_id`) or in top-level columns.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from kernelagent.rl.reward import RewardBreakdown

if TYPE_CHECKING:
    from kernelagent.harness import FingerprintedEvaluator

_PROBLEM_KEYS = ("problem_source", "problem_path", "problem")


def _as_dict(message: Any) -> dict:
    """A message as a plain dict (verifiers 0.1.14 uses pydantic messages; older ones dicts)."""
    if isinstance(message, dict):
        return dict(message)
    if hasattr(message, "model_dump"):
        return message.model_dump(exclude_none=True)
    return {"role": getattr(message, "role", ""), "content": getattr(message, "content", "")}


def _action(message: dict) -> Any:
    """KernelEnv's action for an assistant message: its text, or the message with OpenAI
    `tool_calls` (verifiers 0.1.14 flattens a call to `{id, name, arguments}`)."""
    calls = message.get("tool_calls") or []
    if not calls:
        content = message.get("content") or ""
        return content if isinstance(content, str) else str(content)
    flat = []
    for i, call in enumerate(calls):
        call = _as_dict(call)
        fn = call.get("function") or call
        flat.append({"id": call.get("id") or f"call_{i}", "type": "function",
                     "function": {"name": fn.get("name", ""), "arguments": fn.get("arguments", "{}")}})
    return {"role": "assistant", "content": message.get("content") or "", "tool_calls": flat}


class KernelEpisodes:
    """The verifiers hooks over `KernelEnv`, one episode per rollout state (no verifiers
    import). `env_options` are KernelEnv's (mode, max_turns, trials, reward_config, ...)."""

    def __init__(self, evaluator: FingerprintedEvaluator, **env_options: Any) -> None:
        from kernelagent.rl.env import KernelEnv

        KernelEnv(evaluator, **env_options)  # bad options fail here, not in a rollout
        self.evaluator, self.env_options = evaluator, env_options

    @staticmethod
    def problem_of(state: dict) -> tuple[str, str | None]:
        sources = [state.get("info"), (state.get("input") or {}).get("info"), state.get("input"), state]
        for src in sources:
            if isinstance(src, dict):
                for key in _PROBLEM_KEYS:
                    if src.get(key):
                        return str(src[key]), src.get("problem_id")
        raise ValueError("the rollout has no problem: its row needs `problem_source` or "
                         "`problem_path` (in `info`, as `kernelagent dataset prompts` writes them)")

    def start(self, state: dict) -> list[dict]:
        """setup_state: a fresh KernelEnv on the row's problem; returns its prompt messages."""
        from kernelagent.rl.env import KernelEnv

        problem, problem_id = self.problem_of(state)
        env = KernelEnv(self.evaluator, **self.env_options)
        prompt = env.reset(problem, problem_id=problem_id)
        state["kernel_env"], state["kernel_stepped"] = env, 0
        if env.tools_schema:
            state["kernel_tool_schemas"] = env.tools_schema
        return prompt

    def respond(self, messages: list[Any], state: dict) -> list[dict]:
        """env_response: step the model's newest reply; return the feedback messages. When
        the episode ends, the feedback is also `state["final_env_response"]` (the stop
        signal of verifiers 0.1.x)."""
        env = state["kernel_env"]
        replies = [m for m in map(_as_dict, messages) if m.get("role") == "assistant"]
        if env.done or len(replies) <= state["kernel_stepped"]:
            return []
        before = len(env.messages)
        env.step(_action(replies[-1]))
        state["kernel_stepped"] = len(replies)
        feedback = [m for m in env.messages[before:] if m.get("role") in ("user", "tool")]
        if env.done:
            state["final_env_response"] = feedback or [
                {"role": "user", "content": "The episode has ended."}]
        return feedback

    def breakdown(self, state: dict, completion: list[Any] | None = None) -> RewardBreakdown:
        """The episode's terminal reward. A reply still unanswered (verifiers' max_turns
        stopped the loop first) is stepped; then the episode is finished."""
        env = state["kernel_env"]
        if not env.done and completion:
            self.respond(list(completion), state)
        if not env.done:
            env.finish("rollout_ended")
        assert env.final is not None
        state["kernel_reward"] = env.final.to_dict()
        return env.final

    def reward(self, state: dict, completion: list[Any] | None = None) -> float:
        """The rubric's reward function (0.0 for a harness failure, whose value is None)."""
        return self.breakdown(state, completion).value or 0.0


_env_class: Any = None


def verifiers_env_class() -> type:
    """The `verifiers.MultiTurnEnv` subclass (built on first use: verifiers is imported here)."""
    global _env_class
    if _env_class is not None:
        return _env_class
    try:
        import verifiers as vf
        from verifiers.envs.multiturn_env import MultiTurnEnv
    except ImportError as exc:
        raise ImportError(f"kernelagent.rl.verifiers_env needs verifiers 0.1.x ({exc})") from exc

    class KernelVerifiersEnv(MultiTurnEnv):
        """A verifiers MultiTurnEnv whose turns are `KernelEnv.step`."""

        def __init__(self, evaluator: FingerprintedEvaluator, *, mode: str = "auto", max_turns: int = 10,
                     env_options: dict[str, Any] | None = None, **kwargs: Any) -> None:
            self.episodes = KernelEpisodes(evaluator, mode=mode, max_turns=max_turns,
                                           **(env_options or {}))
            episodes = self.episodes

            async def kernel_reward(state, completion=None, **_: Any) -> float:
                return await asyncio.to_thread(episodes.reward, state, completion)

            kwargs.setdefault("rubric", vf.Rubric(funcs=[kernel_reward], weights=[1.0]))
            super().__init__(max_turns=max_turns, **kwargs)

        async def setup_state(self, state: Any) -> None:
            await asyncio.to_thread(self.episodes.start, state)
            schemas = state.get("kernel_tool_schemas")
            if schemas:  # offer the agent's tools in verifiers' own Tool format
                from verifiers.types import Tool

                state["tool_defs"] = [Tool(name=s["function"]["name"],
                                           description=s["function"].get("description", ""),
                                           parameters=s["function"].get("parameters", {}))
                                      for s in schemas]

        async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(self.episodes.respond, list(messages), state)

    _env_class = KernelVerifiersEnv
    return _env_class


def load_environment(evaluator: FingerprintedEvaluator, dataset: Any = None, **options: Any) -> Any:
    """A verifiers environment over `evaluator` (an Evaluator or EvaluatorPool). `dataset`:
    a `datasets.Dataset` or a list of `dataset prompts` rows (their `problem_*` columns are
    moved into `info`). Other options: mode, max_turns, env_options, and MultiTurnEnv's."""
    if isinstance(dataset, list):
        from datasets import Dataset

        rows = []
        for row in dataset:
            info = dict(row.get("info") or {})
            info.update({k: v for k, v in row.items() if k.startswith("problem")})
            rows.append({"prompt": row["prompt"], "info": info})
        dataset = Dataset.from_list(rows)
    return verifiers_env_class()(evaluator, dataset=dataset, **options)
