"""The evaluation harness: does a candidate compile, is it correct, how fast is it.

    from kernelagent.harness import Evaluator, EvalConfig
    with Evaluator(device="auto") as ev:
        result = ev.evaluate("benchmarks/level1/1_relu.py", candidate_source)

The folders say which process a file runs in, and so which side of the trust boundary:

    caller/   the user's process (trusted): Evaluator, EvaluatorPool, the baseline cache, the
              static pass, the bubblewrap prefix, the profile tool. Never runs candidate code.
    server/   the harness server (trusted): forks each job's processes, drives them, relays and
              clocks them, and decides the verdict (verdict.py). Never runs candidate code.
    child/    the job's processes, forked from the server: the reference (trusted) and the
              candidate's (hostile: everything it says is a claim), with what they share
              (inputs, timing, transfer, the in-process evidence, the CUDA build hook, the jail).
    protocol.py  every message between these processes: typed JSON, versioned, bounded.
    contract.py  EvaluatorProtocol: the evaluate() every evaluator (and wrapper) implements.
    config.py, result.py, stats.py, cuda_source.py  plain data and pure functions, used anywhere.

Importing this package does not import torch.
"""

from kernelagent.harness.caller.evaluator import Evaluator, HarnessStartError, evaluate
from kernelagent.harness.caller.pool import EvaluatorPool
from kernelagent.harness.config import DEFAULT_TOLERANCES, EvalConfig, StageTimeouts
from kernelagent.harness.contract import EvaluatorProtocol, FingerprintedEvaluator
from kernelagent.harness.result import EvalResult, Flag, Status, Timing, TrialResult

__all__ = ["DEFAULT_TOLERANCES", "EvalConfig", "EvalResult", "Evaluator", "EvaluatorPool",
           "EvaluatorProtocol", "FingerprintedEvaluator", "Flag", "HarnessStartError", "Status",
           "StageTimeouts", "Timing", "TrialResult", "evaluate"]
