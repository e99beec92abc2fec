"""The one evaluation contract: what every evaluator offers its callers.

    def run(evaluator: EvaluatorProtocol, problem, source): return evaluator.evaluate(problem, source)

The harness's own `Evaluator` and `EvaluatorPool` implement it, and so does every wrapper above
them (the store-backed evaluators of bench and ci, the MCP server's per-call evaluator, the RL
Ray backend): an agent, a search, an RL environment or a bench run takes any of them.
`tests/test_contract.py` finds every class of the package that defines `evaluate` and checks
that it has this signature, or is one of the few other seams listed there with their own Protocol.

Importing this module imports neither torch nor the harness's processes.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kernelagent.harness.config import EvalConfig
    from kernelagent.harness.result import EvalResult
    from kernelagent.problem import Problem


@runtime_checkable
class EvaluatorProtocol(Protocol):
    """Judges one candidate against one problem. Never raises for a bad candidate (its verdict
    says what is wrong); `config` None is the default EvalConfig; `cancel`, set from any thread,
    gives up on this evaluation (a harness error that says it was cancelled) where the
    implementation can stop it, and is otherwise accepted and documented as not honoured."""

    def evaluate(self, problem: Problem | str | Path, candidate_source: str,
                 config: EvalConfig | None = None, *,
                 cancel: threading.Event | None = None) -> EvalResult: ...


@runtime_checkable
class FingerprintedEvaluator(EvaluatorProtocol, Protocol):
    """An evaluator that also says which machine judges (the agent's prompt, the RL
    environment's device facts, a run's record)."""

    def fingerprint(self) -> dict[str, Any]: ...


__all__ = ["EvaluatorProtocol", "FingerprintedEvaluator"]
