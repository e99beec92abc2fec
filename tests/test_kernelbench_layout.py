"""KernelBench's own file format loads as it is: no smoke inputs, sizes in module globals
or constructor arguments, parameters drawn from the RNG in __init__."""

from __future__ import annotations

from kernelagent.harness import Status
from kernelagent.problem import load_problem
from tests.conftest import CANDIDATES, TESTS, read

LAYOUT = TESTS / "kernelbench_layout"


def test_problem_metadata_from_kernelbench_path():
    problem = load_problem(LAYOUT / "level1" / "19_ReLU.py")
    assert problem.level == "level1" and problem.name == "19_ReLU"
    assert problem.display == "level1/19_ReLU"
    assert len(problem.sha256) == 64


def test_kernelbench_relu_evaluates_at_its_own_size(evaluator, fast_config):
    result = evaluator.evaluate(LAYOUT / "level1" / "19_ReLU.py", read(CANDIDATES / "relu_good.py"), fast_config)
    assert result.status == Status.CORRECT, result.feedback()
    assert result.input_set == "main"  # no smoke inputs: the problem's own sizes


def test_constructor_arguments_and_seeded_weights_match(evaluator, fast_config):
    problem = LAYOUT / "level2" / "7_Scale_Shift.py"
    result = evaluator.evaluate(problem, read(LAYOUT / "scale_shift_solution.py"), fast_config)
    assert result.status == Status.CORRECT, result.feedback() + result.log
    # Drawing the weight differently breaks the match: the weights really are compared.
    other = read(LAYOUT / "scale_shift_solution.py").replace("torch.randn(features)", "torch.rand(features)")
    mismatch = evaluator.evaluate(problem, other, fast_config)
    assert mismatch.status == Status.INCORRECT
