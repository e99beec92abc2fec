"""The reference's check inputs are made from the global generators, which the early baseline
compile thread (reference_side.start_compiling) seeds too: a check's inputs must wait for it."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import torch

from kernelagent.harness.child import inputs as inputs_mod
from kernelagent.harness.child.reference_side import ReferenceSide


class _Interleaved:
    """A problem whose input maker lets a 'compile thread' reseed the generators at the worst
    moment (after the check's seeding, before its draws), deterministically."""

    def __init__(self) -> None:
        self.go, self.done = threading.Event(), threading.Event()

    def get_init_inputs(self):
        return []

    def get_inputs(self):
        return self.get_smoke_inputs()

    def get_smoke_inputs(self):
        self.go.set()  # the thread may act now
        self.done.wait(5)
        return [torch.rand(37, 1001)]

    def compile_thread(self, wait_s: float) -> threading.Thread:
        """Reseeds once a check's generation has begun, or after `wait_s` if none does."""
        def work() -> None:
            self.go.wait(wait_s)
            inputs_mod.seed_generators(12345)  # the compile's own first call's inputs
            torch.rand(64)
            self.done.set()

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        return thread


def _clean(seed: int) -> torch.Tensor:
    problem = _Interleaved()
    problem.done.set()
    return inputs_mod.make_inputs(problem, "main", seed, True, torch.device("cpu"))[0]


def test_a_checks_inputs_wait_for_the_baseline_compile_thread():
    clean = _clean(777)
    assert torch.equal(clean, _clean(777))  # the same seed makes the same inputs

    # Made beside the thread, the inputs come out of its state: the race (H100, 2026-11-26: an
    # honest ReLU rejected for input-mutation, every element "changed").
    problem = _Interleaved()
    thread = problem.compile_thread(wait_s=5)
    raced = inputs_mod.make_inputs(problem, "main", 777, True, torch.device("cpu"))[0]
    thread.join()
    assert not torch.equal(raced, clean)

    # The reference's check waits for the thread (which gives up waiting after a second), then
    # makes them. A check that did not wait would start generating, and the thread would reseed
    # in the middle as above.
    problem = _Interleaved()
    side = SimpleNamespace(problem=problem, smoke=True, device=torch.device("cpu"),
                           _compiling=problem.compile_thread(wait_s=1.0))
    side.join_compiling = lambda: ReferenceSide.join_compiling(side)
    made = ReferenceSide.check_inputs(side, "main", 777)[0]
    assert not side._compiling.is_alive()
    assert torch.equal(made, clean)
