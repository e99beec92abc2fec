"""Search strategies: small policies that say, each round, which nodes to grow and how.

A strategy never talks to the model or the harness. `plan(tree, round, n, rng)` returns up
to `n` expansions, each naming a parent (None: a fresh start from the task), an action, and
for best-of-n the trajectory it belongs to. The runner (runner.py) turns each expansion into
one model call and one evaluation, and it is the same for every strategy. `single` (one
conversation, one candidate per turn) is not here: it is the agent loop itself (agent/loop.py).

- best-of-n: N independent conversations from the same start, each continued with its own
  feedback, sharing one budget.
- beam: each round, N children of the K best nodes so far, each prompted with its parent's code
  and the parent's harness feedback (verdict, mismatch, profile).
- evolve: a population; parents are drawn from the top by tournament, and the model is asked to
  mutate one parent or combine two correct ones.

Selection ranks by the speedup interval's LOWER bound (tree.Node.score), never the point.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from kernelagent.search.tree import Node, Tree

STRATEGIES = ("single", "best-of-n", "beam", "evolve")


@dataclass(frozen=True)
class Expansion:
    parent: int | None
    action: str  # fresh | continue | improve | fix | mutate | combine
    chain: int | None = None
    other_parent: int | None = None


class Strategy(Protocol):
    name: str

    def plan(self, tree: Tree, round_: int, n: int, rng: random.Random) -> list[Expansion]: ...


def _fresh(n: int) -> list[Expansion]:
    return [Expansion(None, "fresh", chain=i) for i in range(n)]


def _distinct(tree: Tree) -> list[Node]:
    """Evaluated nodes with a candidate, best first, one per distinct candidate."""
    seen, out = set(), []
    for node in tree.ranked():
        if node.code and node.code_hash not in seen:
            seen.add(node.code_hash)
            out.append(node)
    return out


def _grow(node: Node) -> str:
    return "improve" if node.passed else "fix"


class BestOfN:
    name = "best-of-n"

    def __init__(self, samples: int) -> None:
        self.samples = samples

    def plan(self, tree: Tree, round_: int, n: int, rng: random.Random) -> list[Expansion]:
        if round_ == 0:
            return _fresh(n)
        out = []
        for chain in range(self.samples):
            last = max((x for x in tree.nodes if x.chain == chain and x.state in ("done", "failed")),
                       key=lambda x: x.id, default=None)
            out.append(Expansion(None, "fresh", chain=chain) if last is None
                       else Expansion(last.id, "continue", chain=chain))
        return out[:n]


class Beam:
    name = "beam"

    def __init__(self, width: int) -> None:
        self.width = max(1, width)

    def plan(self, tree: Tree, round_: int, n: int, rng: random.Random) -> list[Expansion]:
        parents = _distinct(tree)[: self.width]
        if round_ == 0 or not parents:
            return _fresh(n)
        return [Expansion(p.id, _grow(p)) for p in (parents[i % len(parents)] for i in range(n))]


class Evolve:
    name = "evolve"

    def __init__(self, elite: int, combine_rate: float = 0.3, fresh_rate: float = 0.1) -> None:
        self.elite, self.combine_rate, self.fresh_rate = max(2, elite), combine_rate, fresh_rate

    def plan(self, tree: Tree, round_: int, n: int, rng: random.Random) -> list[Expansion]:
        population = _distinct(tree)
        if round_ == 0 or not population:
            return _fresh(n)
        top = population[: self.elite]
        correct = [p for p in top if p.passed]
        out = []
        for _ in range(n):
            draw = rng.random()
            if draw < self.fresh_rate:
                out.append(Expansion(None, "fresh"))  # new blood: the population can leave a dead end
            elif draw < self.fresh_rate + self.combine_rate and len(correct) >= 2:
                a, b = rng.sample(correct, 2)
                a, b = (a, b) if a.score() >= b.score() else (b, a)
                out.append(Expansion(a.id, "combine", other_parent=b.id))
            else:
                a, b = rng.choice(top), rng.choice(top)  # a tournament of two: the better one breeds
                parent = a if a.score() >= b.score() else b
                out.append(Expansion(parent.id, "mutate" if parent.passed else "fix"))
        return out


def make(name: str, samples: int, *, beam_width: int | None = None, elite: int | None = None) -> Strategy:
    """The strategy called `name` (not `single`: that is the agent loop)."""
    if name == "best-of-n":
        return BestOfN(samples)
    if name == "beam":
        return Beam(beam_width or max(1, samples // 2))
    if name == "evolve":
        return Evolve(elite or max(2, samples))
    raise ValueError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
