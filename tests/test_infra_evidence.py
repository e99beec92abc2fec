"""Infrastructure verdicts rest on what our processes measured (issue 54, class 5, scope 4): a
claim of the candidate's process never makes `harness_error`, `too_large` or a re-run alone; an
exception raised handling its data is its `rejected: protocol`; a check it failed first stays its
verdict when a later step goes wrong. The decision logic of server/job.py and
server/failures.py, run on a Job with no processes (its supervision replaced by each row's
events); the hostile table (tests/test_hostile.py, r5_* rows) runs the attacks end to end."""

from __future__ import annotations

import types

import multiprocessing as mp
import time
from pathlib import Path
from typing import Callable

import pytest

from kernelagent.harness.config import EvalConfig
from kernelagent.harness.server.job import Job
from kernelagent.harness.server.stages import ReferenceGone
from kernelagent.harness.server.verdict import CheckRecord

PLANNED = ["trial 0", "trial 1", "derived shapes 0"]


def _job(tmp_path: Path, shared: bool) -> Job:
    job = Job({"job": "j", "config": EvalConfig().to_dict(), "problem_source": "", "candidate_source": ""},
              tmp_path, {"free_bytes": 1 << 30}, {})
    job.ready = {"input_bytes": 256 << 20, "output_bytes": 0}  # large enough to make the harness's OOM plausible
    job.to_ref, job._ref_end = mp.Pipe()
    job.to_cand, job._cand_end = mp.Pipe()
    job.refdir = tmp_path / "reference"
    job.refdir.mkdir()
    job.compile_seed, job.started = 1, time.monotonic()
    job.static_flags = {"has_extra": True}  # no derived sets drawn: the events below are the checks
    job.gate.unregister = lambda _job: shared  # did it share the device (the gate's own record)
    return job


def wrong(job: Job) -> None:
    job.checks.record_check(CheckRecord("trial 0", "main", 1, False, "mismatch at [0]: 1.0 vs 3.0"))


def mutated(job: Job) -> None:
    job.checks.record_check(CheckRecord("trial 0", "main", 1, False, "input 0 changed", rejected="input-mutation"))


def passed(job: Job) -> None:
    job.checks.record_check(CheckRecord("trial 0", "main", 1, True, ""))


def claims(kind: str, text: str) -> Callable[[Job], None]:
    def event(job: Job) -> None:
        job.failures.candidate_failure({"kind": kind, "stage": "correctness", "message": text, "flags": []})
    return event


def ledger_holds(gib: int) -> Callable[[Job], None]:
    """Our memory ledger (gate.MemoryLedger.used) holds `gib` GiB promised to the jobs on the device."""
    def event(job: Job) -> None:
        job.gate_memory = types.SimpleNamespace(used=gib << 30)
    return event


def overflow(job: Job) -> None:
    raise OverflowError("int too large to convert to float")


def reference_dies(job: Job) -> None:
    raise ReferenceGone("was killed by SIGKILL")


def unreadable_data(job: Job) -> None:
    with job.failures.handling_candidate("profiler rows"):
        float(10**400)


def extra_set_error_says_oom(job: Job) -> None:
    job.checks.record_check(CheckRecord("derived shapes 0", "extra:0", 3, False,
                                 "derived shapes 0 raised:\ntorch.OutOfMemoryError: CUDA out of device memory"))


def concludes(job: Job) -> None:
    job.conclude([])


def reference_oom(job: Job) -> None:
    job.checks.record_check(CheckRecord("trial 0", "main", 1, False, "the reference process ran out of device memory "
                                 "checking: CUDA out of memory", harness_error=True))


ROWS = [
    # (events in order, shared device, expected status, a fragment of the reason, re-run alone)
    # the candidate's word is never an infrastructure verdict, nor buys a re-run alone
    ([claims("harness_out_of_memory", "making the inputs raised: CUDA out of memory")], True, "runtime_error",
     "not evidence", False),
    ([claims("out_of_memory", "torch.OutOfMemoryError")], True, "runtime_error", "out of memory", False),
    # ...unless our own ledger had memory of other jobs on the device when it said so: re-run alone
    ([ledger_holds(12), claims("out_of_memory", "torch.OutOfMemoryError")], True, "harness_error",
     "re-run alone", True),
    ([ledger_holds(12), claims("out_of_memory", "torch.OutOfMemoryError")], False, "runtime_error",
     "out of memory", False),
    ([claims("too_large", "too large for this machine")], True, "runtime_error", "too large", False),
    ([claims("harness_error", "the harness failed")], False, "runtime_error", "the harness failed", False),
    # an extra set's failure text is the candidate's: no out-of-memory evidence in it
    ([passed, extra_set_error_says_oom, overflow], True, "harness_error", "harness error", False),
    # the reference's own out-of-memory beside others: our evidence, re-run alone
    ([reference_oom, concludes], True, "harness_error", "re-run alone", True),
    # an exception reading the candidate's data: its protocol breach
    ([passed, unreadable_data], False, "rejected", "[protocol]", False),
    # the first failure wins
    ([wrong, overflow], False, "incorrect", "mismatch", False),
    ([wrong, reference_dies], True, "incorrect", "mismatch", False),
    ([mutated, overflow], False, "rejected", "input-mutation", False),
    # ...and a fault with no failure of the candidate's before it stays ours
    ([passed, overflow], False, "harness_error", "OverflowError", False),
    ([passed, reference_dies], False, "harness_error", "the reference process", False),
]


@pytest.mark.parametrize("events, shared, status, fragment, alone", ROWS,
                         ids=["harness-oom-claim", "oom-claim", "oom-beside-others-by-our-ledger",
                              "oom-alone-by-our-ledger", "too-large-claim", "harness-error-claim",
                              "oom-words-in-extra-error", "reference-oom", "unreadable-data", "wrong-then-bug",
                              "wrong-then-reference-gone", "mutation-then-bug", "bug-alone", "reference-gone-alone"])
def test_infrastructure_verdicts_need_our_own_evidence(events, shared, status, fragment, alone, tmp_path):
    job = _job(tmp_path, shared)

    def supervise() -> None:
        job.planned = list(PLANNED)
        for event in events:
            event(job)

    job.checks.supervise = supervise
    result = job.run().to_wire()
    assert result["status"] == status, result["reason"]
    assert fragment in result["reason"], result["reason"]
    assert bool(result["concurrency"].get("retry_alone")) == alone, result["concurrency"]
    if status != "harness_error" and any(e in (overflow, reference_dies) for e in events):
        assert any(f["kind"] == "later-fault" for f in result["flags"]), result["flags"]


@pytest.mark.parametrize("decided, status", [("incorrect", "incorrect"), ("rejected", "rejected"),
                                             ("correct", "harness_error"), (None, "harness_error")])
def test_a_fault_after_the_verdict_keeps_the_candidates_failure(decided, status):
    """server/main.py: a job whose run raised after its verdict (its evidence, its clean-up)."""
    import queue
    from types import SimpleNamespace

    from kernelagent.harness import verdict as fold
    from kernelagent.harness.server.job import Job
    from kernelagent.harness.server.job_record import JobRecord
    from kernelagent.harness.server.main import Dispatcher

    sent = []
    job = SimpleNamespace(start=SimpleNamespace(fork=lambda: None), facts=JobRecord(), outcomes=[])
    job.record = types.MethodType(Job.record, job)  # the job's one writer of its verdict

    def run():
        if decided:  # the verdict, then a fault in finish_result
            job.record(fold.Concluded(decided, "trial 0: mismatch", "correctness"))
        raise OverflowError("int too large to convert to float")

    job.run = run
    nonces: dict = {"j": queue.Queue()}
    nonces["j"].put("n")
    dispatcher = SimpleNamespace(send=lambda kind, job_id, nonce=None, **fields: sent.append((kind, fields)),
                                 _nonces=nonces, cancelled=lambda job_id: False)
    Dispatcher._run_job(dispatcher, job, "j", 0.0, time.monotonic())
    result = sent[-1][1]["result"]
    assert sent[-1][0] == "result" and result["status"] == status, result
    if status == decided:
        assert any(f["kind"] == "later-fault" for f in result["flags"])


def test_the_server_that_refused_a_deep_message_serves_the_next_evaluation(evaluator):
    """r5_deep_json (a 200,000-deep array as its outputs message) and then an honest kernel, on one
    harness server: the first is the candidate's `rejected: protocol`, the server lives on."""
    from kernelagent.harness import EvalConfig
    from tests.conftest import CANDIDATES

    config = EvalConfig(trials=1)
    problem = CANDIDATES / "relu_problem.py"
    hostile = evaluator.evaluate(problem, (Path(__file__).parent / "adversarial" / "r5_deep_json.py").read_text(),
                                 config)
    server = evaluator._proc.pid
    assert hostile.status == "rejected" and "nested 200" in hostile.reason, hostile.reason
    assert any(f.kind == "protocol" for f in hostile.flags)
    honest = evaluator.evaluate(problem, (CANDIDATES / "relu_good.py").read_text(), config)
    assert honest.status == "correct", honest.reason
    assert evaluator._proc.pid == server


def test_a_malformed_message_from_the_reference_is_not_the_candidates_breach():
    """The reference is our process: a frame of its that the server cannot read is a harness
    error (ReferenceGone), never `rejected: protocol` for the candidate."""
    from types import SimpleNamespace

    from kernelagent.harness.server.channels import Channels

    server_end, reference_end = mp.Pipe()
    job = SimpleNamespace(to_ref=server_end, ref_alive_fd=None, ref=object(), job_id="j", ref_nonce="n",
                          wait=lambda conns, deadline: [server_end])
    reference_end.send_bytes(b'{"v":2,"type":"verdict","job":"j","nonce":"n","seed":' + str(10**400).encode() + b"}")
    with pytest.raises(ReferenceGone, match="could not read"):
        Channels(job).ref_recv({"verdict"}, time.monotonic() + 5)


class _FakeNvml:
    """NVML as server/failures.candidate_device_bytes reads it: `rows` are (pid, bytes)."""

    def __init__(self, rows: dict[int, int] | None):
        self.rows = rows

    def handle(self, uuid, pci_bus_id):
        return object()

    def process_bytes(self, handle):
        return self.rows

    def close(self) -> None:
        pass


def _reference_gone_oom(job: Job) -> None:
    raise ReferenceGone("exited with code 1 (CUDA out of device memory)")


@pytest.mark.parametrize("held_gib, event, shared, status, fragment, alone", [
    # issue 54's memory hog: the candidate's process holds 139 GiB when the reference runs out
    (139, reference_oom, False, "runtime_error", "more than this evaluation's whole share", False),
    (139, reference_oom, True, "runtime_error", "more than this evaluation's whole share", False),
    (139, _reference_gone_oom, False, "runtime_error", "more than this evaluation's whole share", False),
    # within its share (3 GiB promised + the slack): the failure stays ours, re-run alone beside others
    (3, reference_oom, True, "harness_error", "re-run alone", True),
    (3, reference_oom, False, "harness_error", "out of device memory", False),
    # NVML cannot say, or lists no process of the candidate's: never blamed on a guess
    (None, reference_oom, False, "harness_error", "out of device memory", False),
    ("other pid", reference_oom, True, "harness_error", "re-run alone", True),
], ids=["hog-alone", "hog-beside-others", "hog-reference-died", "within-share-beside", "within-share-alone",
        "no-nvml-reading", "not-the-candidates-process"])
def test_the_reference_out_of_memory_is_the_candidates_when_it_held_more_than_its_share(
        held_gib, event, shared, status, fragment, alone, tmp_path, monkeypatch):
    import os
    import subprocess
    import sys

    from kernelagent.harness.child import sm_clocks

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # the candidate's process
    try:
        pid = 1 if held_gib == "other pid" else child.pid  # pid 1: on the device, never in the candidate's tree
        rows = None if held_gib is None else {pid: (139 if held_gib == "other pid" else held_gib) << 30,
                                              os.getpid(): 600 << 20}  # ours (the reference's) is not counted
        monkeypatch.setattr(sm_clocks.Nvml, "open", classmethod(lambda cls, name="": _FakeNvml(rows)))
        job = _job(tmp_path, shared)
        job.fingerprint["cuda"] = True

        def supervise() -> None:
            job.planned = list(PLANNED)
            # the candidate's process as the job knows it, already reaped when the job cleans up
            job.cand = types.SimpleNamespace(pid=child.pid, exitcode=0, is_alive=lambda: False,
                                             join=lambda timeout=None: None, kill=lambda: None)
            job.concurrency["memory_reserved_bytes"] = 3 << 30  # the ledger's promise to this evaluation
            event(job)
            job.conclude([])

        job.checks.supervise = supervise
        result = job.run().to_wire()
    finally:
        child.kill()
        child.wait()
    assert result["status"] == status, result["reason"]
    assert fragment in result["reason"], result["reason"]
    assert bool(result["concurrency"].get("retry_alone")) == alone, result["concurrency"]
    if held_gib == 139:
        assert result["concurrency"]["candidate_device_bytes"] == 139 << 30


def test_nvml_process_rows_are_read_bounded_and_unknown_sizes_left_out():
    """sm_clocks.Nvml.process_bytes over a fake libnvidia-ml: v3's rows summed by pid, NVML's
    'not available' size and impossible pids dropped, a failing call None."""
    import ctypes

    from kernelagent import nvml
    from kernelagent.harness.child import sm_clocks

    def v3(handle, count, rows):
        entries = [(4242, 5 << 30), (4242, 1 << 30), (77, nvml.NOT_AVAILABLE), (0, 1 << 20), (9, 0)]
        count._obj.value = len(entries)
        for i, (pid, size) in enumerate(entries):
            rows[i].pid, rows[i].usedGpuMemory = pid, size
        return 0

    lib = types.SimpleNamespace(nvmlDeviceGetComputeRunningProcesses_v3=v3)
    assert sm_clocks.Nvml(lib).process_bytes(ctypes.c_void_p()) == {4242: 6 << 30}
    lib = types.SimpleNamespace(nvmlDeviceGetComputeRunningProcesses=lambda handle, count, rows: 999)
    assert sm_clocks.Nvml(lib).process_bytes(ctypes.c_void_p()) is None
    assert sm_clocks.Nvml(types.SimpleNamespace()).process_bytes(ctypes.c_void_p()) is None
