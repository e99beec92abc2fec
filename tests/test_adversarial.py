"""Adversarial candidates, one or more per exploit class (kernelagent/harness/defences.py
has the table), each with the verdict its class calls for. CPU (Triton interpreter): runs in
CI. The CUDA-only forms are in test_adversarial_gpu.py."""

from __future__ import annotations

import dataclasses
import os
import pwd
from pathlib import Path

import pytest

from kernelagent.harness import EvalConfig, Evaluator, Status, StageTimeouts
from tests.conftest import BENCHMARKS, CANDIDATES, REPO, read

# One worker for the file (pytest-xdist): its module fixtures (its evaluator) are made once.
pytestmark = pytest.mark.xdist_group("adversarial")

ADV = Path(__file__).resolve().parent / "adversarial"
RELU = CANDIDATES / "relu_problem.py"
SOFTMAX_WIDE = ADV / "softmax_wide_problem.py"
MATMUL = BENCHMARKS / "level1" / "8_matmul.py"

BASE = EvalConfig(trials=2, target_ms=10, warmup_ms=2, min_reps=3, max_reps=12, baselines=False,
                  timeouts=StageTimeouts(start=60, load=30, compile=60, correctness=90, timing=60))
NO_STATIC = dataclasses.replace(BASE, static_check="off")

# (candidate, problem, config, expected status, expected flag kind or None)
TABLE = [
    # 1 no custom kernel
    ("c01_torch_relu.py", RELU, BASE, Status.REJECTED, "static:no-custom-kernel"),
    ("c01_torch_relu.py", RELU, NO_STATIC, Status.REJECTED, "no-custom-kernel"),
    ("c01_dummy_kernel_disguised_torch.py", RELU, BASE, Status.REJECTED, "no-custom-kernel"),
    ("c01_nn_module.py", RELU, BASE, Status.REJECTED, "no-custom-kernel"),
    ("c01_matmul_torch.py", MATMUL, BASE, Status.REJECTED, "no-custom-kernel"),
    # 2 fallback to the reference
    ("c02_try_except_fallback.py", RELU, BASE, Status.REJECTED, "static:fallback-to-reference"),
    ("c02_try_except_fallback.py", RELU, NO_STATIC, Status.REJECTED, "fallback-to-reference"),
    ("c02_condition_fallback.py", RELU, BASE, Status.REJECTED, "fallback-to-reference"),
    # 3 caching across calls
    # By pointer: every check and every timed iteration gets freshly generated inputs. When
    # the allocator hands a freed input's address to a new input, the stale answer is caught
    # (incorrect, or rejected as output-caching); when it does not, the cache never hits and
    # the candidate computed honestly. Either way no stale answer passes.
    ("c03_cache_by_pointer.py", RELU, BASE, (Status.CORRECT, Status.INCORRECT, Status.REJECTED), None),
    ("c03_cache_by_shape.py", RELU, BASE, Status.REJECTED, "output-caching"),
    # By identity: the same, every call gets new tensor objects, so the cache never hits.
    ("c03_cache_by_identity.py", RELU, BASE, Status.CORRECT, None),
    # Honest during the checks, cached in the timed loop: the timed-output check catches it.
    ("c03_cache_after_checks.py", RELU, BASE, Status.INCORRECT, None),
    # 4 hiding work
    ("c04_thread_deferred.py", RELU, BASE, Status.REJECTED, "static:hidden-work"),
    ("c04_thread_deferred.py", RELU, NO_STATIC, Status.REJECTED, "hidden-work"),
    ("c04_thread_left_alive.py", RELU, NO_STATIC, Status.REJECTED, "hidden-work"),
    # 5 tampering
    ("c05_patch_perf_counter.py", RELU, BASE, Status.REJECTED, "static:tampering"),
    ("c05_patch_perf_counter.py", RELU, NO_STATIC, Status.REJECTED, "tampering"),
    ("c05_patch_harness_timer.py", RELU, BASE, Status.REJECTED, "static:tampering"),
    # Its patched timer reads every call at timing.MIN_SAMPLE_MS (a zero was a protocol breach
    # before the floor, issue 41); the replaced functions are tampering, found after the loop
    ("c05_patch_harness_timer.py", RELU, NO_STATIC, Status.REJECTED, "tampering"),
    ("c05_patch_allclose_hidden.py", RELU, BASE, Status.REJECTED, "tampering"),
    ("c05_patch_event_class.py", RELU, BASE, Status.REJECTED, "tampering"),
    # 6 numeric modes
    ("c06_tf32_modes.py", RELU, BASE, Status.REJECTED, "static:numeric-modes"),
    ("c06_tf32_modes.py", RELU, NO_STATIC, Status.REJECTED, "numeric-modes"),
    # 7 inputs
    ("c07_alias_output.py", RELU, BASE, Status.REJECTED, "output-alias"),
    ("c07_mutate_input.py", RELU, BASE, Status.REJECTED, "input-mutation"),
    # 8 stale memory (the CUDA form is in the GPU tests)
    ("c08_empty_output.py", RELU, BASE, Status.INCORRECT, None),
    ("c08_reuse_buffer.py", RELU, BASE, Status.REJECTED, "output-caching"),
    # 9 lazy and odd outputs
    ("c09_tensor_subclass.py", RELU, BASE, Status.REJECTED, "output-type"),
    ("c09_lazy_object.py", RELU, BASE, Status.REJECTED, "output-type"),
    # 10 reading the reference's answer
    ("c10_gc_scan.py", RELU, BASE, Status.REJECTED, "reading-reference"),
    ("c10_frame_walk.py", RELU, BASE, Status.REJECTED, "static:reading-reference"),
    ("c10_frame_walk.py", RELU, NO_STATIC, Status.REJECTED, "reading-reference"),
    # In the per-job namespaces the reference's directory does not exist for the candidate (the
    # attempt finds nothing, and the honest kernel is correct); without them the audit hook's
    # evidence rejects it.
    ("c10_read_reference_dir.py", RELU, BASE, (Status.CORRECT, Status.REJECTED), None),
    # 11 input distribution
    ("c11_relu_identity.py", RELU, BASE, Status.INCORRECT, "input-distribution"),
    # 12 precision downgrade
    ("c12_bf16_downgrade.py", RELU, BASE, Status.INCORRECT, None),
    # 13 shape specialisation: correct on the main shape, flagged for review
    ("c13_shape_specialised.py", RELU, BASE, Status.CORRECT, "shape-specialisation"),
    # 14 tolerance blind spots
    ("c14_zeros.py", SOFTMAX_WIDE, BASE, Status.INCORRECT, None),
    ("c14_uniform.py", SOFTMAX_WIDE, BASE, Status.INCORRECT, None),
    # under the old flat 1% floor (issue 54): rows summing to 1.008, judged by the float64 run
    ("c14_drop_last_block.py", CANDIDATES / "vocab_softmax_problem.py", BASE, Status.INCORRECT, None),
    # complex outputs compared on their real part only passed this (issue 54)
    ("c14_rfft_real_only.py", CANDIDATES / "rfft_problem.py", BASE, Status.INCORRECT, None),
    # 15 sandbox
    ("c15_write_outside.py", RELU, BASE, Status.REJECTED, "sandbox-escape"),
    ("c15_network.py", RELU, BASE, Status.REJECTED, "static:sandbox-escape"),
    ("c15_network.py", RELU, NO_STATIC, Status.REJECTED, "sandbox-escape"),
    # 16 impossible speed: GPU only (no roofline on the CPU; see test_roofline_is_noted_on_cpu)
]


@pytest.fixture(scope="module")
def adv_evaluator(cache_dir):
    with Evaluator(device="cpu", cache_dir=cache_dir) as ev:
        yield ev


def _id(row) -> str:
    return row[0].removesuffix(".py") + ("-nostatic" if row[2].static_check == "off" else "")


@pytest.mark.parametrize("row", TABLE, ids=[_id(r) for r in TABLE])
def test_exploit_gets_its_verdict(adv_evaluator, row):
    name, problem, config, status, kind = row
    result = adv_evaluator.evaluate(problem, read(ADV / name), config)
    print(f"\n{name}: {result.status} {result.reason[:300]}")
    assert result.status in (status if isinstance(status, tuple) else (status,)), \
        result.feedback() + "\n" + result.log
    assert not result.passed or name in ("c03_cache_by_pointer.py", "c03_cache_by_identity.py",
                                         "c10_read_reference_dir.py")
    if kind is not None:
        kinds = [f.kind for f in result.flags]
        assert kind in kinds, result.feedback()
        flag = next(f for f in result.flags if f.kind == kind)
        expected = {"shape-specialisation": "review", "input-distribution": "info"}.get(kind, "reject")
        assert flag.severity == expected
        if status == Status.REJECTED:
            # The reason names the class and its evidence, for the model to act on.
            assert f"[{kind.removeprefix('static:')}]" in result.reason or kind.startswith("static:"), result.reason
            assert "candidate.py" in result.reason or kind in ("output-type", "output-alias", "input-mutation",
                                                               "tampering", "numeric-modes", "hidden-work",
                                                               "sandbox-escape", "output-caching", "protocol")


def test_honest_kernel_with_glue_ops_passes(adv_evaluator):
    result = adv_evaluator.evaluate(RELU, read(ADV / "honest_glue.py"), BASE)
    assert result.status == Status.CORRECT, result.feedback() + result.log
    assert result.passed, result.feedback()
    assert not [f for f in result.flags if f.severity != "info"]


def test_defences_off_lets_a_disguised_torch_candidate_through(adv_evaluator):
    """The switch used by benchmarks/harness_overhead.py --no-defences really turns them off."""
    config = dataclasses.replace(BASE, defences=False)
    result = adv_evaluator.evaluate(RELU, read(ADV / "c01_dummy_kernel_disguised_torch.py"), config)
    assert result.status == Status.CORRECT


def test_roofline_is_noted_on_cpu(adv_evaluator):
    result = adv_evaluator.evaluate(RELU, read(CANDIDATES / "relu_good.py"), BASE)
    assert result.passed
    note = [f for f in result.flags if f.kind == "roofline"]
    assert note and note[0].severity == "info" and "CPU" in note[0].message


def test_sandbox_write_did_not_happen_and_isolation_is_reported(adv_evaluator):
    marker = "kernelagent-escape-marker.txt"
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    for where in (home / marker, REPO / marker):
        where.unlink(missing_ok=True)
    result = adv_evaluator.evaluate(RELU, read(ADV / "c15_write_outside.py"), BASE)
    assert result.status == Status.REJECTED
    assert "sandbox-escape" in result.reason
    assert not (home / marker).exists() and not (REPO / marker).exists()
    assert "bubblewrap" in result.isolation and "mode" in result.isolation and "jail" in result.isolation
    print("\nisolation:", result.isolation)


def test_sandbox_under_bubblewrap(cache_dir):
    """With bwrap, the write fails at the OS level too (read-only root, hidden home)."""
    from kernelagent.harness.jail import sandbox

    if sandbox.bubblewrap_command(sandbox.make_scratch_root()) is None:
        pytest.skip("bubblewrap is not installed or cannot create namespaces here (no user namespaces)")
    config = dataclasses.replace(BASE, defences=False)  # only the OS stands in the way
    with Evaluator(device="cpu", cache_dir=cache_dir, isolation="bwrap") as ev:
        result = ev.evaluate(RELU, read(ADV / "c15_write_outside.py"), config)
        net = ev.evaluate(RELU, read(ADV / "c15_network.py"), config)
    marker = "kernelagent-escape-marker.txt"
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert result.isolation["bubblewrap"] is True
    assert "Read-only file system" in result.log, result.log
    assert "written" not in result.log
    assert not (home / marker).exists() and not (REPO / marker).exists()
    assert "network: reached" not in net.log and "network:" in net.log, net.log


@pytest.mark.parametrize("library_kernel, glue, severity", [
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", False, "reject"),
    ("void at::native::elementwise_kernel<128, 4, at::native::direct_copy_kernel_cuda>", True, "info"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", True, "info"),
])
def test_library_kernels_are_glue_only_by_their_names(tmp_path, library_kernel, glue, severity):
    """Issue 24, class 1: a softmax called below the dispatcher (the recorder saw only glue ops)
    while a library kernel held the device. Who did the work decides, by the device kernels'
    names: copies and fills are glue, any other library kernel holding the device is not."""
    from kernelagent.harness.child import defences
    from kernelagent.harness.cuda_source import is_glue_kernel

    assert is_glue_kernel(library_kernel) is glue
    monitor = defences.Monitor(tmp_path / "candidate.py", tmp_path, EvalConfig())
    monitor.calls = [defences.CallEvidence(name=f"check {i}", own_launches=1, ops={}) for i in range(3)]
    share = {"share": 0.04, "glue_share": 0.96 if glue else 0.0, "total_us": 100.0,
             "top": [{"name": library_kernel, "share": 0.96, "own": False, "glue": glue},
                     {"name": "do_nothing_kernel", "share": 0.04, "own": True, "glue": False}]}
    flags = monitor.flags(device_share=share)
    kinds = {f["kind"]: f["severity"] for f in flags}
    if severity == "reject":
        assert kinds.get("no-custom-kernel") == "reject", flags
    else:
        assert kinds.get("no-custom-kernel-info") == "info" and "no-custom-kernel" not in kinds, flags
