"""The evaluation harness: does a candidate compile, is it correct, how fast is it.

    from kernelagent.harness import Evaluator, EvalConfig
    with Evaluator(device="auto") as ev:
        result = ev.evaluate("benchmarks/level1/1_relu.py", candidate_source)

The caller's process never runs candidate code: see evaluator.py, server.py, workers.py.
Importing this package does not import torch.
"""

from kernelagent.harness.config import DEFAULT_TOLERANCES, EvalConfig, StageTimeouts
from kernelagent.harness.evaluator import Evaluator, HarnessStartError, evaluate
from kernelagent.harness.result import EvalResult, Flag, Status, Timing, TrialResult

__all__ = ["DEFAULT_TOLERANCES", "EvalConfig", "EvalResult", "Evaluator", "Flag", "HarnessStartError",
           "Status", "StageTimeouts", "Timing", "TrialResult", "evaluate"]
