"""Out-of-process kernel evidence (server/kernel_evidence.py): the candidate's own kernel names
from its source, and the rules over what Nsight Compute saw. The ncu run itself needs a GPU
(tests/test_profile_gpu.py); here the rules run on synthetic ncu rows, and a fake `ncu`
shows the evaluator's wiring."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelagent.harness.server import kernel_evidence as ke
from kernelagent.harness.server.job_record import JobRecord
from kernelagent.harness.caller.results import apply_kernel_evidence
from tests.conftest import CANDIDATES, read

TRITON = read(CANDIDATES / "relu_good.py")
CUDA = '''
import torch
from torch.utils.cpp_extension import load_inline
src = r"""
__global__ void __launch_bounds__(256) relu_kernel(const float* x, float* y, int n) { }
template <typename T> __global__ void scale_kernel(T* y) { }
"""
'''
AUTOTUNED = '''
import triton
@triton.autotune(configs=[], key=["n"])
@triton.jit
def tuned(x_ptr, n):
    pass
def helper(x):
    return x
'''


def test_own_names_come_from_the_source():
    assert ke.static_own_names(TRITON) == {"relu_kernel"}
    assert {"relu_kernel", "scale_kernel"} <= ke.static_own_names(CUDA)
    assert ke.static_own_names(AUTOTUNED) == {"tuned"}
    assert ke.static_own_names("def (") == set()


def _k(name, per_call_ns, launches=3):
    """An ncu row for `per_call_ns` of device time in each of the kernel_evidence.CALLS profiled calls."""
    return {"name": name, "launches": launches, "total_ns": per_call_ns * ke.CALLS}


def test_no_own_kernel_is_rejected():
    flags = ke.judge({"kernels": [_k("ampere_sgemm_128x64_nn", 1.5e6), _k("vectorized_elementwise_kernel", 5e4)]},
                     {"matmul_kernel"}, median_ms=1.1)
    assert [f["kind"] for f in flags] == ["no-custom-kernel"] and flags[0]["severity"] == "reject"
    assert "ampere_sgemm" in flags[0]["message"] and "matmul_kernel" in flags[0]["message"]


def test_own_kernel_with_most_of_the_time_passes():
    assert ke.judge({"kernels": [_k("matmul_kernel", 1.5e6), _k("fill_kernel", 5e3)]}, {"matmul_kernel"},
                    median_ms=1.05) == []


def test_library_kernels_doing_most_work_are_hidden_work():
    flags = ke.judge({"kernels": [_k("ampere_sgemm_128x64_nn", 1.5e6), _k("relu_kernel", 5e4)]}, {"relu_kernel"},
                     median_ms=1.1)
    assert [f["kind"] for f in flags] == ["hidden-work"] and flags[0]["severity"] == "reject"


def test_copies_and_fills_beside_the_own_kernel_are_glue_by_either_name():
    """An honest candidate whose `.contiguous()` copy takes more device time than its kernel
    (as on an H100, where ncu's demangled name was only `void at::elementwise_kernel<128, 2,
    void at::gpu_kernel_impl`): glue by the mangled name's `direct_copy_kernel_cuda`."""
    copy = dict(_k("void at::elementwise_kernel<128, 2, void at::gpu_kernel_impl", 3e5),
                mangled="_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastIZZZNS0_"
                        "23direct_copy_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE1_clEvENKUlvE8_clEvEUlfE_EEvS4_"
                        "RKT_EUliE_EEviT1_")
    fill = _k("void at::vectorized_elementwise_kernel<4, at::FillFunctor<float>", 3e4)
    assert ke.judge({"kernels": [copy, _k("relu_kernel", 1.65e5), fill]}, {"relu_kernel"}, median_ms=0.4) == []
    # the same copy with no name that says so is work, and then the library did most of it
    unnamed = dict(copy, mangled="_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocast")
    flags = ke.judge({"kernels": [unnamed, _k("relu_kernel", 1.65e5), fill]}, {"relu_kernel"}, median_ms=0.4)
    assert [f["kind"] for f in flags] == ["hidden-work"]
    assert "gpu_kernel_impl" in flags[0]["message"]
    # glue alone is not enough: a library softmax beside copies is still work
    soft = _k("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", 4.5e5)
    flags = ke.judge({"kernels": [soft, copy, _k("touch_kernel", 5e3)]}, {"touch_kernel"}, median_ms=0.5)
    assert [f["kind"] for f in flags] == ["hidden-work"] and "cunn_SoftMaxForward" in flags[0]["message"]


def test_kernels_longer_than_the_reported_time_disagree_with_the_clock():
    # CALLS profiled calls of 2 ms each on the device, but the reported median is 0.5 ms
    flags = ke.judge({"kernels": [_k("relu_kernel", 2e6)]}, {"relu_kernel"}, median_ms=0.5)
    assert [f["kind"] for f in flags] == ["clock-mismatch"]
    assert ke.judge({"kernels": [_k("relu_kernel", 2e6)]}, {"relu_kernel"}, median_ms=1.9) == []


def test_nothing_seen_gives_no_flag():
    assert ke.judge({"kernels": []}, {"relu_kernel"}, median_ms=1.0) == []


def test_eval_kernel_evidence_is_on_by_default_and_silent_on_the_cpu(tmp_path):
    """On by default (the flag turns it off); on the CPU no such evidence exists, and a result
    there says nothing of it (its timings are not meaningful, so it is no GPU win anyway)."""
    import json

    from typer.testing import CliRunner

    from kernelagent.cli import app
    from kernelagent.harness import EvalConfig

    assert EvalConfig().kernel_evidence is True
    out = CliRunner().invoke(app, ["eval", str(CANDIDATES / "relu_problem.py"), str(CANDIDATES / "relu_good.py"),
                                   "--device", "cpu", "--trials", "1", "--no-baselines", "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert result["status"] == "correct" and result["config"]["kernel_evidence"] is True
    assert not any(f["kind"] == "kernel-evidence" for f in result["flags"])


def _cuda_result():
    from kernelagent.harness import EvalResult, Status, Timing

    return EvalResult(status=Status.CORRECT, correct=True, fingerprint={"cuda": True},
                      timings={"candidate": Timing(median_ms=1.0, q1_ms=1.0, q3_ms=1.0, min_ms=1.0, reps=5)})


def test_evidence_that_cannot_be_collected_keeps_a_result_from_counting_as_a_win(tmp_path):


    result = _cuda_result()
    assert result.passed
    apply_kernel_evidence(result, {"unavailable": "ncu (Nsight Compute) was not found",
                                                           "seconds": 0.2}, TRITON)
    assert result.status == "correct" and not result.passed
    flag = next(f for f in result.flags if f.kind == "kernel-evidence")
    assert flag.severity == "review" and "does not count as a win" in flag.message and "ncu" in flag.message
    # A server that sent nothing back (an older one, or a bug) is no evidence either.
    silent = _cuda_result()
    apply_kernel_evidence(silent, None, TRITON)
    assert not silent.passed and "did not run it" in silent.flags[0].message


def test_what_the_candidate_did_under_ncu_rejects_it_as_the_main_run_would(tmp_path):
    """h3_gc_monitor_none on an H200: the monitor switched off in the main run, gc.get_objects()
    seen by the ncu entry's audit. That is a rejection, not a `kernel-evidence` review."""


    result = _cuda_result()
    evidence = {"unavailable": "the candidate did something not allowed under ncu",
                "violations": {"reading-reference": ["gc.get_objects() at candidate.py:19"],
                               "made-up-kind": ["ignored"], "tampering": "not a list"}}
    apply_kernel_evidence(result, evidence, TRITON)
    assert result.status == "rejected" and not result.correct
    assert [(f.kind, f.severity) for f in result.flags] == [("reading-reference", "reject")]
    assert "gc.get_objects()" in result.flags[0].message and "Nsight Compute" in result.flags[0].message
    # Malformed violations are no evidence of anything: the review flag as before.
    odd = _cuda_result()
    apply_kernel_evidence(odd, {"unavailable": "x", "violations": ["a"]}, TRITON)
    assert odd.status == "correct" and [f.kind for f in odd.flags] == ["kernel-evidence"]


@pytest.mark.parametrize("line", ["[" * 200_000 + "]" * 200_000, '{"tampering": [' + str(10**400) + ']}',
                                  "not json at all"], ids=["deep", "huge-int", "garbage"])
def test_an_unbounded_report_line_under_ncu_is_the_candidates_tampering(line):
    """Issue 54, class 5: the session's last line comes from the process that runs the candidate
    again; a 200,000-deep array there was a RecursionError reading the evidence."""
    import subprocess

    from kernelagent.harness.server import ncu

    proc = subprocess.CompletedProcess([], 0, stdout="KERNELAGENT_NCU_DONE " + line + "\n", stderr="")
    read = ncu.read_session(None, proc, 60, None, 10, 0.0)
    assert [f["kind"] for f in ke.violations_under_ncu(read)] == ["tampering"], read


def test_the_evidence_jail_hides_the_callers_own_directories(tmp_path):
    from types import SimpleNamespace

    from kernelagent.harness.caller.evaluator import Evaluator

    me = SimpleNamespace(hide=[str(tmp_path / "secret")], _scratch_root=tmp_path / "scratch",
                         cuda_cache_dir=tmp_path / "builds", cache=SimpleNamespace(root=tmp_path / "baselines"))
    hidden = Evaluator._evidence_hide(me)
    assert {str(tmp_path / d) for d in ("secret", "scratch", "builds", "baselines")} <= set(hidden)


def test_evidence_is_judged_for_a_reviewed_result_but_not_a_rejected_or_failed_one(tmp_path):
    """A correct result flagged for review is no win, but a torch-only one must still end rejected
    on what ncu saw; one already rejected, or not correct, is left as it is."""

    from kernelagent.harness import Flag

    torch_only = {"kernels": [_k("ampere_sgemm_128x64_nn", 1.5e6)]}
    reviewed = _cuda_result()
    reviewed.flags.append(Flag("clock-mismatch", "the candidate's clock disagrees", "review"))
    apply_kernel_evidence(reviewed, torch_only, TRITON)
    assert reviewed.status == "rejected" and "no-custom-kernel" in [f.kind for f in reviewed.flags]

    rejected = _cuda_result()
    rejected.flags.append(Flag("hidden-work", "a thread outlived forward()", "reject"))
    apply_kernel_evidence(rejected, torch_only, TRITON)
    assert [f.kind for f in rejected.flags] == ["hidden-work"] and rejected.kernel_evidence in ({}, None)

    incorrect = _cuda_result()
    incorrect.status, incorrect.correct = "incorrect", False
    apply_kernel_evidence(incorrect, torch_only, TRITON)
    assert incorrect.flags == [] and incorrect.status == "incorrect"


def test_evaluator_turns_reject_evidence_into_a_rejection(tmp_path):
    """The caller's wiring (caller/results.apply_kernel_evidence) on a CUDA result, with the server's ncu
    answer stood in: a reject flag from the evidence makes the verdict `rejected`, with the reason."""

    from kernelagent.harness import Status

    result = _cuda_result()
    apply_kernel_evidence(result, {"kernels": [_k("ampere_sgemm_128x64_nn", 1.5e6)],
                                                           "seconds": 4.5}, TRITON)
    assert result.status == Status.REJECTED and not result.correct
    assert result.reason.startswith("[no-custom-kernel]") and result.stage == "evidence"
    assert result.kernel_evidence["kernels"][0]["name"] == "ampere_sgemm_128x64_nn"
    assert result.stage_seconds["evidence"] == 4.5  # what the evidence cost, in the result


# -- the server's side (server/evidence.py) ----------------------------------------------------

def _job(tmp_path, **over):
    from types import SimpleNamespace

    from kernelagent.harness import EvalConfig
    from kernelagent.harness.server.profilers import Profilers
    root = tmp_path / "scratch-root" / "job-1"
    root.mkdir(parents=True)
    stages = []
    job = SimpleNamespace(
        request={"options": {"evidence": {"hide": [str(tmp_path / "baselines")]}, "cuda_cache_dir": None},
                 "problem_source": read(CANDIDATES / "relu_problem.py"), "candidate_source": TRITON,
                 "candidate_sha256": "abc"},
        config=EvalConfig(), fingerprint={"cuda": True}, jail={"mode": "namespaces", "hide": [str(tmp_path / "h")]},
        facts=JobRecord(status="correct"), root=root, enter=stages.append, limit=lambda stage: 120.0,
        stages=stages, concurrency={}, idle_probe=lambda: True,
        gate=SimpleNamespace(hold=lambda job, probe, stats, freeze=True: ("slot", job, probe, stats, freeze),
                             active=lambda: 3,
                             profilers=Profilers()))
    for key, value in over.items():
        setattr(job, key, value)
    return job


def test_the_server_collects_evidence_for_every_correct_unrejected_gpu_result(tmp_path):
    from kernelagent.harness import EvalConfig
    from kernelagent.harness.server import evidence

    assert evidence.wanted(_job(tmp_path / "a"))
    assert not evidence.wanted(_job(tmp_path / "b", fingerprint={"cuda": False}))
    assert not evidence.wanted(_job(tmp_path / "c", facts=JobRecord(status="incorrect")))
    # flagged for review: still checked, so a torch-only result ends rejected, not reviewed
    assert evidence.wanted(_job(tmp_path / "d", facts=JobRecord(status="correct", flags=[
        {"kind": "clock-mismatch", "message": "", "severity": "review"}])))
    assert not evidence.wanted(_job(tmp_path / "d2", facts=JobRecord(status="correct", flags=[
        {"kind": "hidden-work", "message": "", "severity": "reject"}])))
    assert not evidence.wanted(_job(tmp_path / "e", config=EvalConfig(kernel_evidence=False)))
    no_ask = _job(tmp_path / "f")
    no_ask.request["options"].pop("evidence")
    assert not evidence.wanted(no_ask)


def _fake_session(monkeypatch, seen, collect):
    """kernel_evidence.start stands in for the session's start (what it was given in `seen`), and
    its Early's collect for the session's run (`collect(**kwargs)`)."""
    from types import SimpleNamespace

    def start(problem, source, **kwargs):
        seen.update(kwargs, problem=problem, source=source, problem_text=Path(problem).read_text())
        return SimpleNamespace(collect=lambda **k: (seen.update(collect_kwargs=k), collect(**k))[1])

    monkeypatch.setattr(ke, "start", start)


def test_the_server_runs_the_evidence_in_the_jobs_jail_and_stops_it_with_the_job(tmp_path, monkeypatch):
    from kernelagent.harness.server import evidence

    seen = {}
    _fake_session(monkeypatch, seen, lambda **k: {"kernels": [_k("relu_kernel", 5e4)]})
    job = _job(tmp_path)
    evidence.collect(job)
    assert job.facts.evidence["kernels"][0]["name"] == "relu_kernel" and job.facts.evidence["seconds"] >= 0
    assert job.stages == ["evidence", "finished"]
    hidden = {str(p) for p in seen["hide"]}
    # the caller's list, the job jail's own list and the server's scratch root (other jobs)
    assert {str(tmp_path / "baselines"), str(tmp_path / "h"), str(tmp_path / "scratch-root")} <= hidden
    assert seen["namespaces"] is True and seen["device"] == "cuda" and seen["scratch_parent"] == job.root
    ran = seen["collect_kwargs"]
    assert seen["source"] == TRITON and ran["timeout"] == 120.0
    assert ran["lock_wait_s"] == 360.0  # every live job's session may be ahead of this one
    # the candidate's part of the session takes the device's timing slot, like a timed loop (the
    # others running on while it warms up; ncu_session stops them for the profiled calls)
    slot = ran["on_ready"]()
    assert slot[:3] == ("slot", job, job.idle_probe) and slot[3] is job.concurrency["evidence_slot"]
    assert slot[4] is False
    assert seen["problem_text"] == job.request["problem_source"]


def test_a_harness_bug_in_the_evidence_is_said_as_such(tmp_path, monkeypatch):
    from kernelagent.harness.server import evidence

    def broken(**kwargs):
        raise KeyError("ours")

    _fake_session(monkeypatch, {}, broken)
    job = _job(tmp_path)
    evidence.collect(job)
    assert job.facts.evidence["unavailable"].startswith("harness error") and job.facts.status == "correct"


def test_the_ncu_session_runs_as_the_jobs_uid_unless_turned_off(tmp_path, monkeypatch):
    """On by default (an H200 run read the counters as uid 65534); KERNELAGENT_NCU_AS_JOB_UID=0
    turns it off; a job without a uid of its own gives none."""
    from types import SimpleNamespace

    from kernelagent.harness.server import evidence

    job = SimpleNamespace(jail={"mode": "namespaces", "run_as": [65534, 65534]})
    monkeypatch.delenv("KERNELAGENT_NCU_AS_JOB_UID", raising=False)
    assert evidence.session_uid(job) == (65534, 65534)
    monkeypatch.setenv("KERNELAGENT_NCU_AS_JOB_UID", "0")
    assert evidence.session_uid(job) is None
    monkeypatch.setenv("KERNELAGENT_NCU_AS_JOB_UID", "1")
    assert evidence.session_uid(job) == (65534, 65534)
    assert evidence.session_uid(SimpleNamespace(jail={"mode": "namespaces", "run_as": None})) is None
    assert evidence.session_uid(SimpleNamespace(jail=None)) is None