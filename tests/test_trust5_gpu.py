"""Issue 54's GPU-only attacks (the trust5 set), held out for a device run: hostile candidates in
tests/gpu_attacks/trust5/ (each file's docstring says what it does and what must catch it) and the
situations a candidate file cannot make (a squatted Nsight Compute lock folder, a spare session
taken as it expires), set up here. Each hostile case gets no better than its honest verdict: never
`harness_error`, never `correct`; the honest controls pass. Run in a device session:

    bash scripts/device/gpu_focus.sh 400 tests/test_trust5_gpu.py

Small problems, trials=2, no baselines: about a minute on an H200 (the spare test, which waits
SPARE_WAIT_S, only with KERNELAGENT_TRUST5_SPARE=1)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from kernelagent.harness import EvalConfig, Status
from tests.conftest import CANDIDATES, Submitted, read

pytestmark = pytest.mark.gpu

TRUST5 = Path(__file__).resolve().parent / "gpu_attacks" / "trust5"
RELU = CANDIDATES / "relu_problem.py"
BIG_RELU = CANDIDATES / "gpu_big_relu_problem.py"
SOFTMAX = CANDIDATES / "softmax_small_problem.py"
CONFIG = EvalConfig(trials=2, baselines=False)
NO_STATIC = EvalConfig(trials=2, baselines=False, static_check="off")
NCU = EvalConfig(trials=2, baselines=False, evidence="ncu")
NCU_NO_STATIC = EvalConfig(trials=2, baselines=False, evidence="ncu", static_check="off")
# What a candidate's own failure may be; `harness_error`, `too_large` and `correct` are not.
CANDIDATE_FAILURES = (Status.INCORRECT, Status.RUNTIME_ERROR, Status.REJECTED, Status.CRASHED, Status.TIMEOUT,
                      Status.COMPILE_ERROR)

# (case, problem, candidate file, config, the verdicts it may get)
HOSTILE = [
    ("b forged harness oom", BIG_RELU, "b_forged_harness_oom.py", NO_STATIC,
     (Status.RUNTIME_ERROR, Status.INCORRECT, Status.CRASHED, Status.REJECTED)),
    ("e softmax sign switch", SOFTMAX, "e_softmax_sign_switch.py", CONFIG, (Status.INCORRECT, Status.REJECTED)),
]
HONEST = [
    ("honest relu", RELU, CANDIDATES / "relu_good.py", CONFIG),
    ("honest softmax", SOFTMAX, TRUST5 / "honest_softmax.py", CONFIG),
]


def _show(name, result):
    print(f"\n{name}: {result.status} — {result.reason[:300]!r}"
          + "".join(f"\n  [{f.severity}:{f.kind}] {f.message[:200]}" for f in result.flags)
          + f"\n  concurrency {result.concurrency} memory {result.memory}")


@pytest.fixture(scope="module")
def results(cuda_evaluator):
    cases = {name: (problem, read(TRUST5 / path), config) for name, problem, path, config, _ in HOSTILE}
    cases.update({name: (problem, read(path), config) for name, problem, path, config in HONEST})
    submitted = Submitted(cuda_evaluator, cases)
    yield submitted
    submitted.close()


@pytest.mark.parametrize("name, problem, path, config, allowed", HOSTILE, ids=[row[0] for row in HOSTILE])
def test_hostile_candidates_get_no_better_than_their_honest_verdict(results, name, problem, path, config, allowed):
    result = results[name]
    _show(name, result)
    assert result.status != Status.HARNESS_ERROR and not result.passed, result.feedback()
    assert result.status in allowed, result.feedback()


@pytest.mark.parametrize("name", [row[0] for row in HONEST])
def test_honest_controls_pass(results, name):
    result = results[name]
    _show(name, result)
    assert result.passed, result.feedback() + result.log


def test_memory_hog_is_judged_as_the_candidate(results, cuda_evaluator):
    """Attack (a), alone on the server (after the batch above: its hog would starve the others):
    a wrong kernel holding ~95% of the device's free memory while the reference's process runs."""
    for name in [row[0] for row in HOSTILE + HONEST]:
        results[name]  # every batched case ended before the hog starts
    result = cuda_evaluator.evaluate(RELU, read(TRUST5 / "a_memory_hog.py"), NO_STATIC)
    _show("a memory hog", result)
    print(f"  retried alone: {result.concurrency.get('retried_alone')}")
    assert result.status != Status.HARNESS_ERROR and result.status != Status.TOO_LARGE, result.feedback()
    assert not result.passed and result.status in CANDIDATE_FAILURES, result.feedback()
    # the device is the next job's again: an honest candidate right after passes
    after = cuda_evaluator.evaluate(RELU, read(CANDIDATES / "relu_good.py"), CONFIG)
    _show("honest after the hog", after)
    assert after.passed, after.feedback()


def _need_ncu():
    from kernelagent.harness.server.ncu import find_ncu

    if find_ncu() is None:
        pytest.skip("needs Nsight Compute (ncu)")


def test_squatted_ncu_lock_folder_is_not_used(tmp_path, monkeypatch, cache_dir):
    """Attack (d): another local user (uid 65534) made this user's Nsight Compute lock folder
    first, in a sticky world-writable temp directory, left it open to all (0777) and planted the
    lock files in it. harness/private_dir.py must refuse the folder (not ours) and the caller must
    use a fresh private one (ncu_session.lock_dir_for_servers): the honest kernel's ncu session
    runs and passes, nothing of ours is written into the squatted folder, and no verdict is a
    `harness_error`. Needs root (os.chown) and its own server (the lock folder is chosen when a
    server starts)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if os.geteuid() != 0:
        pytest.skip("needs root, to give the squatted folder to another uid (os.chown)")
    _need_ncu()
    from kernelagent.harness import Evaluator
    from kernelagent.harness.server import ncu_session

    shared_tmp = tmp_path / "shared-tmp"
    shared_tmp.mkdir()
    shared_tmp.chmod(0o1777)
    squat = shared_tmp / f"kernelagent-{os.getuid()}"
    squat.mkdir()
    for name in (f"kernelagent-ncu-{os.getuid()}.lock", f"kernelagent-ncu-{os.getuid()}-0.lock"):
        (squat / name).write_text("")
        os.chown(squat / name, 65534, 65534)
    os.chown(squat, 65534, 65534)
    squat.chmod(0o777)
    planted = sorted(p.name for p in squat.iterdir())
    monkeypatch.delenv("KERNELAGENT_NCU_LOCK_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(shared_tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    monkeypatch.setattr(ncu_session, "_FRESH", [])
    with Evaluator(device="cuda", cache_dir=cache_dir, daemon=False) as evaluator:
        honest = evaluator.evaluate(RELU, read(CANDIDATES / "relu_good.py"), NCU)
        cheat = evaluator.evaluate(RELU, read(TRUST5 / "c_spare_late_torch.py"), NCU_NO_STATIC)
    _show("honest, lock folder squatted", honest)
    _show("torch cheat, lock folder squatted", cheat)
    print(f"  lock folder used: {ncu_session._FRESH}; squatted folder holds {sorted(p.name for p in squat.iterdir())}")
    assert honest.passed, honest.feedback()
    assert any(k["name"].startswith("relu_kernel") for k in honest.kernel_evidence.get("kernels", [])), \
        honest.kernel_evidence
    assert cheat.status != Status.HARNESS_ERROR and not cheat.passed, cheat.feedback()
    assert sorted(p.name for p in squat.iterdir()) == planted
    assert all(p.stat().st_uid == 65534 for p in squat.iterdir())


@pytest.mark.skipif(os.environ.get("KERNELAGENT_TRUST5_SPARE") != "1",
                    reason="attack (c) waits SPARE_WAIT_S (180 s) for the spare to near its end: beyond this "
                           "file's budget; KERNELAGENT_TRUST5_SPARE=1 (and KERNELAGENT_GPU_FILE_BUDGET_S=400) runs it")
def test_a_spare_taken_as_it_expires_gives_the_cheat_no_win(cuda_evaluator):
    """Attack (c): an honest job with `evidence="ncu"` leaves a spare session for the next job of
    its problem; the cheat is submitted 2 s before the spare ends by itself (SPARE_WAIT_S). Its
    verdict: not a pass, not `harness_error`."""
    _need_ncu()
    from kernelagent.harness.server.evidence import SPARE_WAIT_S

    first = cuda_evaluator.evaluate(RELU, read(CANDIDATES / "relu_good.py"), NCU)
    _show("honest, leaves a spare", first)
    assert first.passed, first.feedback()
    time.sleep(max(SPARE_WAIT_S - 2.0, 0.0))
    cheat = cuda_evaluator.evaluate(RELU, read(TRUST5 / "c_spare_late_torch.py"), NCU_NO_STATIC)
    _show("torch cheat on the expiring spare", cheat)
    assert cheat.status != Status.HARNESS_ERROR and not cheat.passed, cheat.feedback()
