"""The evidence stage with the trace as the default (issue 55), on the CPU: which results Nsight
Compute audits (server/audit.py), what the server does with a job's trace (server/evidence.stage:
trace judged, ncu only where planned, asked, a win, or the trace cannot decide), and what the
caller makes of both (caller/results.apply_kernel_evidence: the trace's flags, the audit's
disagreement). Traces are built with tests/tracefake.py, so the decoder and the rules run too."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from kernelagent.harness.server import audit
from kernelagent.harness.caller.results import apply_kernel_evidence
from kernelagent.harness.config import EvalConfig
from kernelagent.harness.result import EvalResult, Status, Timing
from kernelagent.harness.server.job_record import JobRecord
from kernelagent.harness.server import evidence
from kernelagent.harness.trace.channel import TraceBytes
from tests import tracefake

OWN = "relu_kernel"
SOURCE = f"import triton\n@triton.jit\ndef {OWN}(x):\n    pass\n"
CHECKS, WARMUPS, SEGMENTS, CALLS = 3, 2, 2, 4


def _trace(body=None, **kw) -> bytes:
    return tracefake.process(body or tracefake.one(OWN, 50), checks=CHECKS, warmups=WARMUPS, segments=SEGMENTS,
                             calls=CALLS, **kw).to_bytes()


def _job(data: bytes | None, *, config: EvalConfig | None = None, evidence_options: dict | None = None,
         median_ms: float = 0.05, overflow: bool = False) -> SimpleNamespace:
    """A job at its evidence stage: correct, on a GPU, the caller asked for evidence."""
    trace = None if data is None else TraceBytes(data=data, overflow=overflow, ended=True, read_bytes=len(data))
    return SimpleNamespace(
        config=config or EvalConfig(), fingerprint={"cuda": True}, early_evidence=None, early_counted=False,
        request={"options": {"evidence": {"hide": [], **(evidence_options or {})}}, "candidate_source": SOURCE},
        facts=JobRecord(status=Status.CORRECT, timings={"candidate": {"median_ms": median_ms}},
                        timed_loop={"calls": SEGMENTS * CALLS, "warmup_calls": WARMUPS}),
        trace=trace, trace_channel=None, trace_checks=CHECKS)


@pytest.fixture
def ncu_runs(monkeypatch):
    """evidence.collect stands in for the Nsight Compute session: it records that it ran and
    reports the kernels given (the honest kernel's, unless a test says otherwise)."""
    runs: list[SimpleNamespace] = []
    kernels = [{"name": OWN, "launches": 2, "total_ns": 100_000}]

    def collect(job):
        runs.append(job)
        job.facts.evidence = {"kernels": list(kernels), "seconds": 10.0}

    monkeypatch.setattr(evidence, "collect", collect)
    monkeypatch.setattr(evidence, "announce_baselines", lambda job: None)
    return SimpleNamespace(runs=runs, kernels=kernels)


# -- which results are audited ---------------------------------------------------------------------

def test_the_share_is_drawn_with_a_secret_key_and_holds_its_rate():
    shas = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(4000)]
    config = EvalConfig(audit_share=0.1)
    drawn = [audit.audit_drawn(config, sha, key=b"k1") for sha in shas]
    assert 0.08 < sum(drawn) / len(drawn) < 0.12
    # the same candidate draws the same way under one key, and another key draws others
    assert drawn == [audit.audit_drawn(config, sha, key=b"k1") for sha in shas]
    other = [audit.audit_drawn(config, sha, key=b"k2") for sha in shas]
    assert other != drawn
    assert not any(audit.audit_drawn(EvalConfig(audit_share=0.0), sha) for sha in shas[:200])
    assert all(audit.audit_drawn(EvalConfig(audit_share=0.0, audit=True), sha) for sha in shas[:50])
    assert all(audit.audit_drawn(EvalConfig(audit_share=0.0, evidence="ncu"), sha) for sha in shas[:50])


@pytest.mark.parametrize("settings, error", [({"evidence": "nvtx"}, "evidence"), ({"audit_share": 1.5}, "audit_share"),
                                             ({"audit_share": float("nan")}, "audit_share")])
def test_evidence_settings_are_validated(settings, error):
    with pytest.raises(ValueError, match=error):
        EvalConfig(**settings)


@pytest.mark.parametrize("timings, expected", [
    ({"compile": {"median_ms": 0.2}}, 0.2),
    ({"compile": {"median_ms": True}}, None),
    ({"compile": {"median_ms": float("inf")}}, None),
    ({"compile": {"median_ms": -1}}, None),
    ({"eager": {"median_ms": 0.2}}, None),
    ("garbage", None),
])
def test_the_inductor_time_a_win_is_judged_by_is_validated(timings, expected):
    options = audit.evidence_options(EvalConfig(audit_share=0.0, audit_wins=True), "sha", {"timings": timings}, ["/h"])
    assert options.get("win_below_ms") == expected and options["audit"] is False and options["hide"] == ["/h"]


# -- the server's stage --------------------------------------------------------------------------

def test_an_honest_traced_result_needs_no_ncu(ncu_runs):
    job = _job(_trace(), config=EvalConfig(audit_share=0.0))
    evidence.stage(job)
    report = job.facts.evidence
    assert not ncu_runs.runs and report["source"] == "trace"
    assert report["trace"]["flags"] == [] and report["trace"]["facts"]["own_ns"] > 0, report


@pytest.mark.parametrize("why, job_kw, role", [
    ("asked", {"evidence_options": {"audit": True}}, "audit"),
    ("a win by the cached Inductor time", {"evidence_options": {"audit_wins": True, "win_below_ms": 0.08}}, "audit"),
    ("evidence=ncu", {"config": EvalConfig(evidence="ncu", audit_share=0.0)}, "primary"),
    ("past the trace's bound", {"overflow": True}, "fallback"),
])
def test_ncu_runs_where_planned_asked_won_or_the_trace_cannot_decide(ncu_runs, why, job_kw, role):
    job = _job(_trace(), **job_kw)
    evidence.stage(job)
    assert len(ncu_runs.runs) == 1, why
    report = job.facts.evidence
    assert report["role"] == role and "trace" in report, (why, report)
    if role == "fallback":
        assert "incomplete" in report["fallback"]


def test_a_result_that_does_not_beat_inductor_is_not_audited_as_a_win(ncu_runs):
    job = _job(_trace(), config=EvalConfig(audit_share=0.0), median_ms=0.05,
               evidence_options={"audit_wins": True, "win_below_ms": 0.04})
    evidence.stage(job)
    assert not ncu_runs.runs and job.facts.evidence["source"] == "trace"


def test_dropped_records_fall_back_to_ncu(ncu_runs):
    fake = tracefake.TraceFake()

    def body(f, phase, index):
        f.kernel(OWN, 50_000)
        if phase == "timed" and index == 1:
            f.dropped(3)

    data = tracefake.process(body, checks=CHECKS, warmups=WARMUPS, segments=SEGMENTS, calls=CALLS, fake=fake).to_bytes()
    job = _job(data, config=EvalConfig(audit_share=0.0))
    evidence.stage(job)
    assert len(ncu_runs.runs) == 1 and job.facts.evidence["role"] == "fallback"


def test_without_a_trace_ncu_stands_in_and_says_why(ncu_runs):
    job = _job(None, config=EvalConfig(audit_share=0.0))
    job.fingerprint["trace"] = {"unavailable": "no CUPTI headers found"}
    evidence.stage(job)
    report = job.facts.evidence
    assert len(ncu_runs.runs) == 1 and report["role"] == "fallback" and "CUPTI" in report["fallback"]


def test_a_result_that_is_not_correct_pays_nothing(ncu_runs):
    job = _job(_trace(), evidence_options={"audit": True})
    job.facts.status = Status.INCORRECT
    evidence.stage(job)
    assert not ncu_runs.runs and job.facts.evidence is None


# -- the caller's verdict --------------------------------------------------------------------------

def _result(median_ms: float = 0.05) -> EvalResult:
    result = EvalResult(status=Status.CORRECT, compiled=True, correct=True, fingerprint={"cuda": True})
    result.timings["candidate"] = Timing(median_ms=median_ms, q1_ms=median_ms, q3_ms=median_ms, min_ms=median_ms,
                                         reps=5, samples_ms=[median_ms] * 5)
    return result


def _served(job: SimpleNamespace) -> dict:
    evidence.stage(job)
    return job.facts.evidence


def test_the_trace_alone_rejects_torch_work(ncu_runs):
    report = _served(_job(_trace(tracefake.one(tracefake.GEMM, 50)), config=EvalConfig(audit_share=0.0)))
    result = _result()
    apply_kernel_evidence(result, report, SOURCE)
    assert result.status == Status.REJECTED and any(f.kind == "no-custom-kernel" for f in result.flags), \
        (result.reason, [(f.kind, f.message) for f in result.flags])
    assert not ncu_runs.runs


def test_an_honest_traced_result_stays_correct_with_its_trace_clock(ncu_runs):
    report = _served(_job(_trace(), config=EvalConfig(audit_share=0.0)))
    result = _result()
    apply_kernel_evidence(result, report, SOURCE)
    assert result.status == Status.CORRECT, (result.reason, [(f.kind, f.message) for f in result.flags])
    assert result.kernel_evidence["trace_ms_per_call"] == pytest.approx(0.05, rel=0.01)
    assert not any(f.kind == "kernel-evidence" for f in result.flags)  # evidence was had: no review


def test_an_audit_that_sees_library_work_the_trace_did_not_rejects(ncu_runs):
    """A candidate that kept its library work out of its own trace (CUPTI switched off around it)
    while ncu, outside its process, saw the library kernel take most of the time."""
    ncu_runs.kernels[:] = [{"name": OWN, "launches": 2, "total_ns": 10_000},
                           {"name": tracefake.GEMM, "launches": 2, "total_ns": 90_000}]
    report = _served(_job(_trace(), evidence_options={"audit": True}))
    result = _result()
    apply_kernel_evidence(result, report, SOURCE)
    assert result.status == Status.REJECTED
    kinds = {f.kind for f in result.flags}
    assert "audit-mismatch" in kinds, [(f.kind, f.message) for f in result.flags]


def test_an_audit_that_agrees_keeps_the_result(ncu_runs):
    report = _served(_job(_trace(), evidence_options={"audit": True}))
    result = _result()
    apply_kernel_evidence(result, report, SOURCE)
    assert result.status == Status.CORRECT, (result.reason, [(f.kind, f.message) for f in result.flags])
    assert result.kernel_evidence["role"] == "audit"


def test_forged_trace_flags_are_validated_before_they_count():
    result = _result()
    report = {"source": "trace", "trace": {"flags": [{"kind": "no-such-kind", "severity": "reject", "message": "x"},
                                                     {"kind": "idle-call", "severity": "pass", "message": "y" * 5000}],
                                           "facts": {}, "incomplete": ""}}
    apply_kernel_evidence(result, report, SOURCE)
    kinds = [(f.kind, f.severity, len(f.message)) for f in result.flags]
    assert kinds == [("idle-call", "reject", 600)], kinds


@pytest.mark.parametrize("change, needed", [
    ({}, True),
    ({"speedups": {"compile": 0.9}}, False),
    ({"status": Status.INCORRECT}, False),
    ({"kernel_evidence": {"source": "ncu"}}, False),
    ({"fingerprint": {}}, False),
])
def test_a_win_the_server_could_not_know_of_is_audited_by_the_caller(change, needed):
    result = dataclasses.replace(_result(), speedups={"compile": 1.3}, kernel_evidence={"source": "trace"})
    result = dataclasses.replace(result, **change)
    assert audit.needs_win_audit(result, EvalConfig(audit_wins=True)) is needed
    assert not audit.needs_win_audit(result, EvalConfig())  # off by default: the seeded share only
    assert not audit.needs_win_audit(result, EvalConfig(audit=True))
    assert not audit.needs_win_audit(result, EvalConfig(audit_wins=False))


def test_verify_audits_every_result():
    from kernelagent.ci.verify import eval_config

    manifest = SimpleNamespace(trials=2)
    entry = SimpleNamespace(backend="triton")
    assert eval_config(manifest, entry, cpu=False).audit is True


@pytest.mark.parametrize("flag, audit_wins, audit_always", [
    ([], False, False),  # a plain eval: the seeded share, as a batch (issue 55's list of audited wins)
    (["--audit", "share"], False, False),
    (["--audit", "wins"], True, False),
    (["--audit", "always"], False, True),
])
def test_eval_audits_what_its_audit_option_asks(eval_configs, flag, audit_wins, audit_always):
    """`eval --audit`: the config each choice hands the harness (the server and the caller's
    needs_win_audit act on it: the rows above)."""
    from typer.testing import CliRunner

    from kernelagent.cli import app
    from tests.conftest import CANDIDATES

    out = CliRunner().invoke(app, ["eval", str(CANDIDATES / "relu_problem.py"), str(CANDIDATES / "relu_good.py"),
                                   "--device", "cpu", "--no-daemon", *flag])
    assert out.exit_code == 0, out.output
    assert [(c.audit_wins, c.audit) for c in eval_configs] == [(audit_wins, audit_always)]


def test_eval_refuses_an_unknown_evidence_source(tmp_path: Path):
    from typer.testing import CliRunner

    from kernelagent.cli import app
    from tests.conftest import CANDIDATES

    out = CliRunner().invoke(app, ["eval", str(CANDIDATES / "relu_problem.py"), str(CANDIDATES / "relu_good.py"),
                                   "--evidence", "nvtx", "--device", "cpu"])
    assert out.exit_code == 2 and "evidence must be 'trace' or 'ncu'" in out.output, out.output
    assert "Traceback" not in out.output
