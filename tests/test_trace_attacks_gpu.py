"""Hostile candidates against the kernel trace (issue 55), each evaluated through the real
harness on a GPU with the default evidence: `pytest -m gpu tests/test_trace_attacks_gpu.py`
(`bash scripts/device/gpu_focus.sh 400 -rP tests/test_trace_attacks_gpu.py`: `-rP` shows each
attack's printed status, reason and flags).

Each candidate in tests/gpu_attacks/trace/ is a ModelNew for tests/candidates/relu_problem.py
whose docstring says what it does and what should catch it. With no audit drawn and none for a
win, only the trace (and the checks and in-process defences before it) judges. Every attack must
not be a win: status rejected, or a reject/review flag of the trace's kinds. The honest Triton
ReLU must pass beside them, and so must t8 (it recognises the tracer, and the trace is there in
every evaluation: honest whenever it is judged; its docstring says why that is fine). t6a passes
only where the cache never hit (every timed call's input fresh memory): then it ran the honest
kernel in every timed call, and the trace says so."""

from __future__ import annotations

import pytest

from kernelagent.harness import EvalConfig, Status
from tests.conftest import CANDIDATES, TESTS, Submitted, read

pytestmark = pytest.mark.gpu

ATTACKS = TESTS / "gpu_attacks" / "trace"
PROBLEM = CANDIDATES / "relu_problem.py"
# The flag kinds of the trace's rules (trace/rules.py), and the audit's disagreement.
TRACE_KINDS = {"trace-missing", "trace-forged", "no-custom-kernel", "hidden-work", "idle-call", "launch-mismatch",
               "outside-interval", "other-context", "untraced-work", "clock-mismatch", "audit-mismatch"}
CAUGHT = ["t1_cupti_disable", "t2_cupti_finalize", "t3_child_process", "t4_thread_other_stream",
          "t5_other_context", "t6b_cache_by_shape", "t7_forge_pipes"]


def _config() -> EvalConfig:
    return EvalConfig(trials=2, baselines=False, audit_share=0.0, audit_wins=False)


@pytest.fixture(scope="module")
def attacked(cuda_evaluator):
    cases = {"honest": (PROBLEM, read(CANDIDATES / "relu_good.py"), _config())}
    for path in sorted(ATTACKS.glob("t*.py")):
        cases[path.stem] = (PROBLEM, read(path), _config())
    submitted = Submitted(cuda_evaluator, cases)
    yield submitted
    submitted.close()


def _describe(name: str, result) -> str:
    trace = (result.kernel_evidence or {}).get("trace") or {}
    return (f"\n{name}: {result.status} reason {result.reason[:300]!r}; flags "
            f"{[(f.kind, f.severity, f.message[:200]) for f in result.flags]}; evidence source "
            f"{(result.kernel_evidence or {}).get('source')}; trace flags "
            f"{[(f.get('kind'), f.get('severity')) for f in trace.get('flags') or []]} incomplete "
            f"{trace.get('incomplete')!r}")


def _not_a_win(result) -> bool:
    """Not correct (rejected, incorrect, crashed...), or correct with a reject/review flag of the
    trace's kinds."""
    if result.status != Status.CORRECT:
        return True
    return any(f.kind in TRACE_KINDS and f.severity in ("reject", "review") for f in result.flags)


def test_every_attack_has_a_candidate():
    assert {p.stem for p in ATTACKS.glob("t*.py")} == {*CAUGHT, "t6a_cache_by_pointer", "t8_recognise_tracer"}
    for path in ATTACKS.glob("t*.py"):
        assert "class ModelNew" in read(path) and read(path).startswith('"""'), path


def test_the_honest_relu_passes_beside_them(attacked):
    result = attacked["honest"]
    print(_describe("honest", result))
    assert result.passed, (result.reason, [(f.kind, f.message[:300]) for f in result.flags])
    assert (result.kernel_evidence or {}).get("source") == "trace", result.kernel_evidence


@pytest.mark.parametrize("name", CAUGHT)
def test_an_attack_on_the_trace_is_not_a_win(attacked, name):
    result = attacked[name]
    print(_describe(name, result))
    assert result.status not in Status.NOT_JUDGED, _describe(name, result)  # a verdict on the candidate
    assert not result.passed and _not_a_win(result), _describe(name, result)


def test_a_cache_by_pointer_is_caught_or_never_hit(attacked):
    result = attacked["t6a_cache_by_pointer"]
    print(_describe("t6a_cache_by_pointer", result))
    assert result.status not in Status.NOT_JUDGED, _describe("t6a_cache_by_pointer", result)
    if result.passed:  # fresh memory for every timed call: the honest kernel ran in each
        facts = ((result.kernel_evidence or {}).get("trace") or {}).get("facts") or {}
        assert facts.get("own_ns", 0) > 0 and facts.get("timed_calls", 0) > 0, result.kernel_evidence
    else:
        assert _not_a_win(result)


def test_recognising_the_tracer_only_makes_it_honest(attacked):
    result = attacked["t8_recognise_tracer"]
    print(_describe("t8_recognise_tracer", result))
    assert result.passed, _describe("t8_recognise_tracer", result)
    assert (result.kernel_evidence or {}).get("source") == "trace", result.kernel_evidence
