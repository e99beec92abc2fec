"""Checks the candidate cannot predict or tell apart (issue 54, class 4; docs/concepts/defences.md).

* The derived shapes were a pure function of the problem's source: a softmax right only at the
  main shape and the shapes derive.derive_check_variants gives for the source, computed offline,
  passed with no `shape-specialisation` flag. They are drawn now per evaluation from a master seed
  the server draws in secret after the fork (server/draws.py), and reach the candidate's process
  only with their own check.
* The "inputs near one" set was recognisable from its values: a cumprod computed in full only
  when every input was within 0.1 of one. Its special values (and the signed normal ones) are
  now mixed into the problem's own inputs, in lines drawn from the check's seed
  (child/special.py).
* Each check's seed is keyed by the master: one seed says nothing of another (they were the
  master plus fixed offsets, so the first trial's seed gave away every later check's inputs).
"""

from __future__ import annotations

import json
import math
import random
import types

import pytest
import torch

from kernelagent.harness import EvalConfig, Status, derive
from kernelagent.harness.child import inputs as inputs_mod
from kernelagent.harness.server import draws
from tests.conftest import CANDIDATES, read

SOFTMAX = CANDIDATES / "softmax_small_problem.py"
CUMPROD = CANDIDATES / "cumprod_problem.py"
CHECKS = EvalConfig(trials=1, timing=False, baselines=False)


def _shapes(result) -> list[dict]:
    return [s["overrides"] for s in result.derived["sets"]]


def _offline_shapes(source: str) -> set[tuple[int, ...]]:
    """What an attacker computes from the source alone: the main shape and every derived set's."""
    shapes = set(map(tuple, derive.input_shapes(source)))
    for variant in derive.derive_check_variants(source, n=8):
        shapes |= set(map(tuple, derive.input_shapes(source, variant)))
    return shapes


def _softmax(shapes: set[tuple[int, ...]] | None) -> str:
    """tests/candidates/softmax_offline_shapes.py, right only at `shapes` (everywhere with None)."""
    source = read(CANDIDATES / "softmax_offline_shapes.py")
    if shapes is None:
        return source.replace("cols = n if tuple(x.shape) in SHAPES else n // 2", "cols = n")
    return source.replace("SHAPES = set()  # filled in by the test", f"SHAPES = {sorted(shapes)!r}")


def test_two_evaluations_draw_different_derived_shapes_and_a_fixed_seed_repeats_them(evaluator):
    honest = _softmax(None)
    first, second = (evaluator.evaluate(SOFTMAX, honest, CHECKS) for _ in range(2))
    for result in (first, second):
        assert result.status == Status.CORRECT and result.passed, result.feedback()
        assert result.seeds["secret"] and len(_shapes(result)) == 2, result.derived
        checked = [t.name for t in result.trials if t.name.startswith("derived shapes")]
        assert checked == [s["name"] for s in result.derived["sets"]]  # what was checked, recorded
    assert _shapes(first) != _shapes(second), (_shapes(first), _shapes(second))
    # Each check's seed is keyed by the master: no fixed offsets between them (master + 0, 1, 2000, ...).
    seeds = sorted(t.seed for t in first.trials)
    assert len(seeds) >= 3 and all(b - a > 1 << 20 for a, b in zip(seeds, seeds[1:])), seeds
    # Drawn from the secret, not from the source: not the sets the source alone gives (one drawn set
    # may meet its fixed counterpart by chance, 1 in 16 for the grown one here; all of them do not).
    offline = derive.derive_check_variants(read(SOFTMAX), n=2)
    assert not (_shapes(first) == offline and _shapes(second) == offline), offline
    # A rejection is reproduced from the result: its master seed gives the same shapes and inputs.
    again = evaluator.evaluate(SOFTMAX, honest, EvalConfig(trials=1, timing=False, baselines=False,
                                                           seed=first.seeds["base"]))
    assert _shapes(again) == _shapes(first) and not again.seeds["secret"]
    assert [t.seed for t in again.trials] == [t.seed for t in first.trials]


def test_a_softmax_right_only_at_the_offline_shapes_is_flagged(evaluator):
    source = read(SOFTMAX)
    attack = evaluator.evaluate(SOFTMAX, _softmax(_offline_shapes(source)), CHECKS)
    assert not attack.passed, attack.feedback()
    failed = [t.name for t in attack.trials if not t.passed]
    assert failed and all(name.startswith("derived shapes") for name in failed), attack.trials
    assert any(f.kind == "shape-specialisation" for f in attack.flags), attack.flags


def test_a_cumprod_that_computes_in_full_only_on_inputs_near_one_is_incorrect(evaluator):
    # A fixed master seed: the checks before the near-one set are then the same in every run (with
    # secret seeds, one CI run in many had no "inputs near one" record; seeds 0-367 all reach it).
    config = EvalConfig(trials=2, timing=False, baselines=False, seed=5)
    hack = evaluator.evaluate(CUMPROD, read(CANDIDATES / "cumprod_detects_near_one.py"), config)
    assert hack.status == Status.INCORRECT, (hack.status, hack.reason)
    passed = {t.name: t.passed for t in hack.trials}
    assert passed["trial 0"] and passed["trial 1"], (hack.reason, hack.trials)
    assert passed.get("inputs near one") is False, (hack.reason, hack.trials)
    assert any(f.kind == "input-distribution" for f in hack.flags)


def test_the_candidate_process_holds_no_derived_shape_before_its_check(tmp_path):
    """What the server knew at the fork is in the candidate's memory: the derived sets are drawn
    after it, and each is handed over with its own check only. A server of its own: in a shared
    one, other evaluations' sets linger, and one problem's derived shapes are few enough that one
    of theirs often equals one of ours (it failed so in 2 of 5 runs of this file)."""
    from kernelagent.harness import Evaluator

    config = EvalConfig(trials=1, timing=False, baselines=False, defences=False, static_check="off")
    with Evaluator(device="cpu", cache_dir=tmp_path / "cache") as own:
        result = own.evaluate(SOFTMAX, read(CANDIDATES / "relu_scans_for_derived_sets.py"), config)
    scans = [line for line in result.log.splitlines() if line.startswith("SCAN ")]
    assert scans and result.derived.get("sets"), (result.log, result.derived)  # there were sets to find
    found = " ".join(map(str, json.loads(scans[0][5:])))

    def written(name: str, value) -> bool:  # as a source writes it, or as a dict's repr does
        value = tuple(value) if isinstance(value, list) else value
        return f"{name} = {value}" in found or f"'{name}': {value}" in found

    leaked = [s["name"] for s in result.derived["sets"] if all(written(k, v) for k, v in s["overrides"].items())]
    assert not leaked, (leaked, found[:600])


# -- the inputs of each check -------------------------------------------------------------------
def _problem(*shapes: tuple[int, ...]) -> types.ModuleType:
    module = types.ModuleType("special_problem")
    module.get_inputs = lambda: [torch.rand(*s) for s in shapes] + [torch.randint(0, 5, (7,))]
    return module


def _near_one(x: torch.Tensor) -> torch.Tensor:
    return (x - 1.0).abs() <= 0.05


@pytest.mark.parametrize("kind", ["near-one", "alt"])
@pytest.mark.parametrize("shape", [(4, 512), (64, 48), (6, 10, 12), (1, 300), (1000,)])
def test_special_values_are_mixed_into_ordinary_inputs_never_alone(kind, shape):
    """The statistic of the whole input looks ordinary; whole lines along every axis carry the
    special values (the check keeps its power); positions change with the seed."""
    problem, cpu = _problem(shape), torch.device("cpu")
    rows = []
    for seed in random.Random(0).sample(range(1 << 40), 6):
        main = inputs_mod.make_inputs(problem, "main", seed, False, cpu)
        mixed = inputs_mod.make_inputs(problem, kind, seed, False, cpu)
        assert torch.equal(mixed[1], main[1])  # integers untouched
        x, y = main[0], mixed[0]
        changed = y != x
        special = _near_one(y) if kind == "near-one" else changed
        share = float(changed.float().mean())
        assert 0.1 < share < 0.8, (shape, seed, share)  # a minority-to-part, never the whole set
        assert torch.equal(y[~changed], x[~changed])  # the rest is the problem's own inputs
        if kind == "near-one":
            assert float((y - 1.0).abs().max()) > 0.5  # the old tell, (x - 1).abs().max() < 0.1, fails
            assert bool(_near_one(y[changed]).all())
        else:
            assert float(y.min()) < 0 and float((y[~changed]).min()) >= 0
        squeezed = special.reshape([n for n in shape if n > 1])
        if squeezed.dim() == 1:  # a prefix or a suffix: a scan from either end starts in it
            assert bool(squeezed[: int(changed.sum())].all()) or bool(squeezed[-int(changed.sum()):].all())
        else:  # whole lines along every axis
            for axis in range(squeezed.dim()):
                assert bool(squeezed.all(dim=axis).any()), (shape, axis)
        rows.append(changed)
    assert len({tuple(r.flatten().tolist()) for r in rows}) == len(rows)  # positions drawn per seed


@pytest.mark.parametrize("shape", [(4, 512), (3, 2, 64)])
def test_every_axis_keeps_a_special_line_in_every_seed(shape):
    """Where the draw picks every line of one axis, that axis gets one line and the others keep
    theirs: a few rows drew all of theirs in 9 of 3,000 seeds, and the fallback then left no
    special row, so a cumprod that computes in full only near one passed (CI, 2026-11-29)."""
    problem, cpu = _problem(shape), torch.device("cpu")
    for seed in random.Random(1).sample(range(1 << 40), 3000):
        y = inputs_mod.make_inputs(problem, "near-one", seed, False, cpu)[0]
        special = _near_one(y)
        assert not bool(special.all()), (shape, seed)
        for axis in range(len(shape)):
            assert bool(special.all(dim=axis).any()), (shape, seed, axis)


def test_check_seeds_say_nothing_of_each_other_or_of_the_master():
    master = draws.draw_master(random.SystemRandom())
    labels = [f"trial {i}" for i in range(5)] + ["alt", "near-one", "extra:0", "extra:1", "post-timing"]
    seeds = [draws.check_seed(master, label) for label in labels]
    assert len(set(seeds)) == len(seeds) and all(0 <= s < 1 << draws.SEED_BITS for s in seeds)
    # no fixed offsets between them (they were master + 0, 1, ..., 1000, 1500, 2000, 3000)
    assert len({b - a for a, b in zip(seeds, seeds[1:])}) == len(seeds) - 1
    assert master not in seeds and draws.check_seed(master, "alt") == draws.check_seed(master, "alt")
    assert math.log2(draws.check_seed(master + 1, "trial 0") ^ seeds[0] or 1) > 8  # a neighbour's master differs


def test_drawn_variants_keep_each_rule_and_differ_by_seed():
    source = read(SOFTMAX)
    main = derive.size_constants(source)
    drawn = [derive.derive_check_variants(source, n=4, rng=random.Random(s)) for s in range(20)]
    for variants in drawn:
        half, grown = variants[0], variants[1]
        for name, v in half.items():
            assert 3 <= v < main[name] and v % 2 == 1 and v >= main[name] // 4
        for name, v in grown.items():
            assert main[name] < v <= main[name] + max(6, main[name] // 64) + 1 and v % 2 == 1
    assert len({json.dumps(v, sort_keys=True) for v in drawn}) > 15
    assert derive.derive_check_variants(source, n=4, rng=random.Random(3)) == drawn[3]  # reproducible
