"""A kernel that ignores part of its output is incorrect, even where the problem's own inputs
hide it (issue 41, class 5): a problem whose reference runs products or scans is also checked on
inputs near one, where every output element stays significant (harness/child/inputs.py)."""

from __future__ import annotations

from kernelagent.harness import EvalConfig, Status
from tests.conftest import CANDIDATES, read

CONFIG = EvalConfig(trials=2, timing=False, baselines=False)
CUMPROD = CANDIDATES / "cumprod_problem.py"


def test_a_cumprod_that_writes_zeros_after_48_columns_is_incorrect(evaluator):
    hack = evaluator.evaluate(CUMPROD, read(CANDIDATES / "cumprod_first48.py"), CONFIG)
    assert hack.status == Status.INCORRECT, (hack.status, hack.reason)
    passed = {t.name: t.passed for t in hack.trials}
    assert passed["trial 0"] and passed["trial 1"]  # the problem's own inputs hide it
    # The check on inputs near one catches it every time. Signed normal inputs catch it now and
    # then (a product of 48 of them stays above the tolerance in a few elements by chance), and
    # the reason names the first check that failed: what is asserted is the check's own verdict.
    assert passed["inputs near one"] is False, hack.trials
    assert hack.reason.startswith(("inputs near one", "signed-normal inputs")), hack.reason
    assert any(f.kind == "input-distribution" for f in hack.flags)


def test_the_honest_cumprod_passes_inputs_near_one(evaluator):
    honest = evaluator.evaluate(CUMPROD, read(CANDIDATES / "cumprod_good.py"), CONFIG)
    assert honest.status == Status.CORRECT, honest.reason
    assert "inputs near one" in [t.name for t in honest.trials]
    off = evaluator.evaluate(CUMPROD, read(CANDIDATES / "cumprod_first48.py"),
                             EvalConfig(trials=2, timing=False, baselines=False, near_one_inputs=False))
    assert "inputs near one" not in [t.name for t in off.trials]
    # what the check adds: without it the hack passed, but where signed normal inputs caught it
    failed = [t.name for t in off.trials if not t.passed]
    assert off.status == Status.CORRECT or failed == ["signed-normal inputs"], (off.status, failed)


def test_a_problem_without_products_or_scans_gets_no_such_check(evaluator):
    relu = evaluator.evaluate(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"), CONFIG)
    assert relu.status == Status.CORRECT
    assert "inputs near one" not in [t.name for t in relu.trials]
