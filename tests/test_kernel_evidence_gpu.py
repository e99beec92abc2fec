"""Kernel evidence on a real GPU, on by default and without bubblewrap: the kernel trace of the
job's own process (issue 55, the default) and Nsight Compute, outside it (`evidence="ncu"`, and as
the trace's audit; the per-job kernel namespaces jail ncu, jail/exec_in.py):
`pytest -m gpu tests/test_kernel_evidence_gpu.py`. Needs Nsight Compute (ncu)."""

from __future__ import annotations

import pytest

from kernelagent.harness import EvalConfig, Status
from tests.conftest import CANDIDATES, TESTS, Submitted, read

pytestmark = pytest.mark.gpu

# Candidates of the earlier hostile set that switch the in-process evidence off (the recorder,
# the monitor, the audit hooks) while PyTorch does the work: `correct` by default before the
# evidence was on by default (issue 24).
TORCH_BEHIND_A_SWITCH = ["h3_dispatch_mode_pop", "h3_gc_monitor_none", "h3_audit_hooks_cleared"]


@pytest.fixture(scope="module")
def evidence_results(cuda_evaluator):
    from kernelagent.harness.server.ncu import find_ncu

    if find_ncu() is None:
        pytest.skip("needs Nsight Compute (ncu)")
    # kernel_evidence is the default; no audit drawn, and none for a win (the cache's Inductor time
    # from other tests would make the honest ReLU one)
    default = EvalConfig(trials=2, baselines=False, audit_share=0.0, audit_wins=False)
    ncu = EvalConfig(trials=2, baselines=False, evidence="ncu")
    audited = EvalConfig(trials=2, baselines=False, audit=True)
    honest = (CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"))
    cases = {"honest": (*honest, ncu), "honest-trace": (*honest, default), "honest-audit": (*honest, audited),
             "honest-off": (*honest, EvalConfig(trials=2, baselines=False, kernel_evidence=False))}
    for name in TORCH_BEHIND_A_SWITCH:
        cases[name] = (CANDIDATES / "relu_problem.py", read(TESTS / "adversarial" / f"{name}.py"), ncu)
        cases[f"{name}-trace"] = (CANDIDATES / "relu_problem.py", read(TESTS / "adversarial" / f"{name}.py"), default)
    return Submitted(cuda_evaluator, cases)


def test_the_evidence_is_on_by_default_and_sees_the_honest_kernel(evidence_results):
    result = evidence_results["honest"]
    off = evidence_results["honest-off"]
    print(f"\nhonest: {result.status} evidence {result.kernel_evidence.get('seconds')} s "
          f"(stage {result.stage_seconds.get('evidence')}), eval {evidence_results.seconds['honest']:.1f} s "
          f"vs {evidence_results.seconds['honest-off']:.1f} s without; kernels "
          f"{[(k['name'][:40], k['launches']) for k in result.kernel_evidence.get('kernels', [])][:4]}")
    assert result.passed, (result.reason, [f.message for f in result.flags])
    names = [k["name"] for k in result.kernel_evidence.get("kernels", [])]
    assert any(n.startswith("relu_kernel") for n in names), result.kernel_evidence
    # As root with the per-job namespaces, the session ran as the job's own uid and still read
    # the counters (server/evidence.py session_uid; README, "files").
    job_uid = (result.isolation.get("jail") or {}).get("job_uid", "")
    if str(job_uid).startswith("uid 65534"):
        assert result.kernel_evidence.get("uid") == 65534, result.kernel_evidence
    # the jail that ran ncu: no bubblewrap on the device machine, so the kernel namespaces
    assert off.passed, (off.status, off.reason[:300], [(f.kind, f.severity, f.message[:300]) for f in off.flags])
    assert not off.kernel_evidence


def test_the_trace_is_the_default_evidence_and_sees_the_honest_kernel(evidence_results):
    """By default the trace of the job's own process is the evidence: no Nsight Compute session
    (no `kernels` of its), the candidate's own kernel seen in every timed call, a stage of
    milliseconds."""
    result = evidence_results["honest-trace"]
    trace = result.kernel_evidence.get("trace") or {}
    print(f"\nhonest traced: {result.status} evidence stage {result.stage_seconds.get('evidence')} s, eval "
          f"{evidence_results.seconds['honest-trace']:.1f} s (ncu: {evidence_results.seconds['honest']:.1f} s); "
          f"{trace}")
    assert result.passed, (result.reason, [(f.kind, f.message[:300]) for f in result.flags])
    assert result.kernel_evidence.get("source") == "trace" and "kernels" not in result.kernel_evidence
    facts = trace.get("facts") or {}
    assert facts.get("own_ns", 0) > 0 and facts.get("timed_calls", 0) > 0, trace
    # decoding and judging the trace, outside the timing slot: 0.11-0.17 s for 512 timed calls and
    # 0.79 s for this test's 1000 (7,636 records) on an H200, against 10.8 s for ncu's session
    assert result.stage_seconds.get("evidence", 99.0) < 3.0


def test_an_audit_runs_ncu_beside_the_trace_and_agrees(evidence_results):
    result = evidence_results["honest-audit"]
    print(f"\nhonest audited: {result.status} role {result.kernel_evidence.get('role')} "
          f"stage {result.stage_seconds.get('evidence')} s")
    assert result.passed, (result.reason, [(f.kind, f.message[:300]) for f in result.flags])
    assert result.kernel_evidence.get("role") == "audit", result.kernel_evidence
    assert any(k["name"].startswith("relu_kernel") for k in result.kernel_evidence.get("kernels", []))
    assert not any(f.kind == "audit-mismatch" for f in result.flags)


@pytest.mark.parametrize("name", TORCH_BEHIND_A_SWITCH)
def test_torch_work_behind_a_switched_off_recorder_is_rejected_by_the_trace(evidence_results, name):
    """The same candidates under the default evidence: the trace sees the library kernel doing
    the work (its own process's CUPTI records, whatever the candidate did to our monitors)."""
    result = evidence_results[f"{name}-trace"]
    print(f"\n{name} traced: {result.status} {result.reason[:200]} "
          f"{[(f.kind, f.severity) for f in result.flags]}")
    assert result.status == Status.REJECTED, (result.status, result.reason,
                                              [(f.kind, f.message[:200]) for f in result.flags])


@pytest.mark.parametrize("name", TORCH_BEHIND_A_SWITCH)
def test_torch_work_behind_a_switched_off_recorder_is_no_win_by_default(evidence_results, name):
    """These switch the in-process evidence off and let PyTorch compute; ncu, outside their
    process, sees the library kernel doing the work, under the default settings."""
    result = evidence_results[name]
    print(f"\n{name}: {result.status} {result.reason[:200]} evidence {result.kernel_evidence} "
          f"({evidence_results.seconds[name]:.1f} s)")
    assert not result.passed
    # Rejected on what ncu saw; or, where the candidate keeps ncu from seeing anything (it hangs
    # or fails there), correct at best but flagged for review: never a win.
    unseen = any(f.kind == "kernel-evidence" and f.severity == "review" for f in result.flags)
    assert result.status == Status.REJECTED or unseen, (result.status, result.reason,
                                                        [(f.kind, f.message[:200]) for f in result.flags])
