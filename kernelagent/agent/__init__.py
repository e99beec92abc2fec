"""The agent: a model proposes Triton kernels, the harness judges them, the loop iterates.

The pieces of one agent run: the loop (loop.py), its tools (tools.py), prompts, budget,
trajectory and live view; episode.py wires them into one episode (optimize, the RL
environments and the prompt datasets all start there). `optimize()`, which wires them into a run (and runs a search or a
whole model), is one floor up, in kernelagent/orchestrate:

    from kernelagent.orchestrate import optimize
    from kernelagent.models import LitellmModel
    run = optimize("problem.py", LitellmModel("openai/gpt-4o"), out="runs/x")
    run.exit_code  # 0 success, 3 correct but short of target, 1 no correct kernel
"""

from __future__ import annotations

from typing import Any

from kernelagent.agent.budget import Budget, LimitsExceeded
from kernelagent.agent.loop import (
    Agent,
    AgentConfig,
    FormatError,
    Observation,
    RunResult,
    Submitted,
    ToolExecutor,
    check_target,
    extract_code,
)
from kernelagent.agent.prompts import Prompts, truncate
from kernelagent.agent.tools import HarnessTools, describe_inputs
from kernelagent.agent.trajectory import Trajectory, write_json_atomic

__all__ = ["Agent", "AgentConfig", "BACKEND", "BACKENDS", "Budget", "Episode", "FormatError", "HarnessTools",
           "LimitsExceeded", "MODES", "Observation", "Prompts", "RunResult", "Submitted", "ToolExecutor",
           "Trajectory", "check_target", "describe", "describe_inputs", "extract_code", "first_messages",
           "prompt_context", "start_episode", "truncate", "write_json_atomic"]

MODES = ("tools", "text", "auto")
BACKEND = "triton"  # the default; "cuda" for CUDA C++ candidates (load_inline)
BACKENDS = ("triton", "cuda")


def describe(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """Device facts for the prompt, from kernelagent.hardware when it is there."""
    try:
        from kernelagent.hardware import describe_device

        return describe_device(fingerprint)
    except Exception:  # an older or broken hardware table must not stop a run
        cuda = bool(fingerprint.get("cuda"))
        return {"name": fingerprint.get("gpu_name") if cuda else "CPU (Triton interpreter)",
                "kind": "cuda" if cuda else "cpu", "sm_count": fingerprint.get("sm_count"),
                "l2_bytes": fingerprint.get("l2_bytes"), "mem_bytes": None,
                "mem_bandwidth_gbs": None, "peak_tflops": {}}


def prompt_context(problem: Any, *, mode: str, backend: str, inputs: Any, device: dict[str, Any], cpu: bool,
                   target_speedup: float, max_turns: int | None, max_tokens: int | None = None,
                   max_cost: float | None = None, timeout: float | None = None) -> dict[str, Any]:
    """The variables the system and task templates are rendered with. One place, so that
    `optimize`, the RL environment and the prompt datasets show a model the same prompts."""
    return dict(mode=mode, backend=backend, problem_name=problem.display,
                reference_source=problem.source.strip(), inputs=inputs, device=device, cpu=cpu,
                target_speedup=target_speedup, max_turns=max_turns, max_tokens=max_tokens,
                max_cost=max_cost, timeout=timeout)


from kernelagent.agent.episode import Episode, first_messages, start_episode  # noqa: E402  (uses the above)
