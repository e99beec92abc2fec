"""One evaluation's secret draws (issue 54, class 4): each check's input seed and the derived
shapes, all from one master seed that the server draws with os.urandom after the candidate's
process is forked (server/job.py run), so that no process running candidate code ever held it.

A check's seed is a keyed hash of the master and the check's label, so the seed the candidate is
handed for one check says nothing about the seed of the next one, nor about the master: before,
the seeds were the master plus fixed offsets, and the first trial's seed gave away every later
check's inputs. The derived shapes come from a generator seeded with the hash of the master and
"shapes", never from the problem's source, so they cannot be computed offline; they reach the
candidate's process only with the check that uses them (server/checks.py).

With `EvalConfig.seed` (`eval --seed N`) the master is N: the same seeds and the same shapes
again, which is how a rejection is reproduced (the result's `seeds.base` is the master)."""

from __future__ import annotations

import hashlib
import random
from typing import Any

MASTER_BITS = 62  # too wide to search from the hashes a candidate sees; under the 2**62 bound on integers in
# EvalConfig and in frames (issue 54, class 5), so `--seed BASE` takes every master
SEED_BITS = 40  # a check's seed, as before: torch.manual_seed takes it on every backend


def draw_master(rng: random.SystemRandom) -> int:
    return rng.getrandbits(MASTER_BITS)


def check_seed(master: int, label: str) -> int:
    """The seed of the check (or loop) named `label`, keyed by the master."""
    digest = hashlib.blake2b(label.encode("utf-8"), key=(int(master) % (1 << 128)).to_bytes(16, "little"),
                             digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


def shapes_rng(master: int) -> random.Random:
    """The generator the derived shapes are drawn from (derive.derive_check_variants)."""
    return random.Random(check_seed(master, "derived shapes") << 24 | check_seed(master, "derived shapes 2"))


def derived_sets(source: str, n: int, master: int) -> dict[str, Any]:
    """The derived check sets of a problem without get_extra_inputs() (derive.derive_check_variants,
    n of them, spares included), drawn from the master: {"overrides": one dict per set, in JSON's
    types, "sets": the result's records, "dims": extra:<j> -> (its dims, the main's, in words)}, or
    {"note": why there are none} when the source cannot be rewritten. The sets vary only constants
    the model's construction does not read, so the model is always built from the main problem;
    the reference validates each set when it runs."""
    from kernelagent.harness import derive, literal_shapes

    try:
        variants = derive.derive_check_variants(source, n, rng=shapes_rng(master))
        for v in variants:
            derive.apply(source, v)  # a set that cannot be written is no set
    except (ValueError, SyntaxError) as exc:
        return {"note": f"no check sets derived: {exc}"}
    env = derive.Module(literal_shapes.lift(source)).env()

    def label(name: str) -> str:  # a lifted shape literal is named by its value in get_inputs()
        return f"literal {env.get(name)}" if name.startswith(literal_shapes.PREFIX) else name

    sets, dims_by_kind = [], {}
    for j, v in enumerate(variants):
        dims = ", ".join(f"{label(k)}={tuple(x) if isinstance(x, list) else x}" for k, x in v.items())
        main = {k: env.get(k) for k in v}
        dims_by_kind[f"extra:{j}"] = (dims, ", ".join(f"{label(k)}={x}" for k, x in main.items()))
        sets.append({"name": f"derived shapes {j} ({dims})", "kind": f"extra:{j}", "overrides": dict(v),
                     "main": main})
    overrides = [{k: list(x) if isinstance(x, tuple) else x for k, x in v.items()} for v in variants]
    return {"overrides": overrides, "sets": sets, "dims": dims_by_kind}


def verified_calls(rng: random.Random, measured: int, expected: int) -> set[int]:
    """Which of the timed loop's `measured` calls the reference verifies from their kept outputs,
    drawn in secret before the loop: the last call, one call drawn uniformly from the others, and
    each of the rest on its own with probability (expected - 1) / (measured - 2), so that
    `expected` besides the last are verified on average (`expected` >= 2). Every call when there
    are no more than `expected` others.

    Why not a fixed number: the candidate's process sees how long the server takes to answer each
    segment, and a segment with a verified call takes a comparison longer. With exactly k drawn,
    once it has seen k slow answers it knows no call before the last is verified any more, and
    can compute wrong from there at no risk. Here every call not yet passed stays verified with at
    least that per-call probability, whatever the candidate has seen (a cheat wrong on a share f
    of the loop from some point on is caught with at least 1 - e^(-2f)); the one uniform draw
    keeps a loop that is wrong on every call but the last caught for certain
    (docs/concepts/defences.md, row 3)."""
    if expected < 2:
        raise ValueError("verified_calls needs expected >= 2: with one, the per-call draws vanish and "
                         "the count is fixed again")
    if measured <= 0:
        return set()
    others = measured - 1
    if others <= expected:
        return set(range(measured))
    uniform = rng.randrange(others)
    share = (expected - 1) / (others - 1)
    return {uniform, others} | {i for i in range(others) if i != uniform and rng.random() < share}
