"""The search (issue 26) against a scripted model with a seeded distribution over candidates.

The stand-in world: a candidate's source declares its approach and cost (`APPROACH = 'approach=A kind=K
cost=C'`). The scripted model starts a fresh approach when its prompt holds no candidate (a
wrong one with p=0.45, a slow one p=0.3, a fast one p=0.25) and otherwise grows the cheapest
candidate it is shown: a fast approach gets 40% cheaper per step down to 0.3, a slow one 10%
down to 1.2, and a wrong one stays wrong (p=0.8) or is abandoned for a fresh draw. The stand-in
executor turns cost into speed (1/cost, with a +-3% interval). "The best candidate" is a fast
approach grown twice (cost <= 0.37).

So `single` wins only when its one conversation draws the fast approach early; the strategies
that hold several lines at once, or choose parents by their verified speed, win more often with
the same number of model calls. Nothing here is timed: the speeds are declared.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time

import pytest

from kernelagent.agent import Agent, AgentConfig, Budget, Observation, Prompts, Trajectory
from kernelagent.agent.tools import TOOL_SCHEMAS
from kernelagent.models.base import ModelReply, Usage
from kernelagent.search import Search, SearchConfig, Tree, load, normalised_hash, records

MARK = re.compile(r"approach=(\d+) kind=(\w+) cost=([\d.]+)")
BEST_COST = 0.37


def module(approach: int, kind: str, cost: float, salt: str = "") -> str:
    return (f"```python\nimport torch\nAPPROACH = 'approach={approach} kind={kind} cost={cost:.4f}'\n{salt}"
            f"class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x  # {approach}\n```")


class WorldModel:
    """The seeded scripted model. Thread-safe; records each call's start and end."""

    name = "world"

    def __init__(self, seed: int, delay: float = 0.0, tokens: int = 100, cost: float = 0.01,
                 interrupt_at: int | None = None) -> None:
        self.rng = random.Random(seed)
        self.delay, self.tokens, self.cost = delay, tokens, cost
        self.lock = threading.Lock()
        self.calls: list[tuple[float, float]] = []
        self.approaches = 0
        self.interrupt_at = interrupt_at
        self.started = 0

    def fresh(self) -> str:
        self.approaches += 1
        draw = self.rng.random()
        kind, cost = ("wrong", 1.0) if draw < 0.45 else ("slow", 1.5) if draw < 0.75 else ("fast", 1.0)
        return module(self.approaches, kind, cost)

    def grow(self, approach: int, kind: str, cost: float) -> str:
        if kind == "wrong":
            return module(approach, "wrong", cost, salt=f"TRY = {self.rng.random():.6f}\n") \
                if self.rng.random() < 0.8 else self.fresh()
        if kind == "fast":
            return module(approach, "fast", max(0.3, cost * 0.6))
        return module(approach, "slow", max(1.2, cost * 0.9))

    def query(self, messages, tools=None) -> ModelReply:
        start = time.time()
        with self.lock:
            # Counted as calls start: two calls that both began before the fifth had ended were
            # both answered, and the test's count of saved replies read 6.
            self.started += 1
            if self.interrupt_at is not None and self.started > self.interrupt_at:
                raise KeyboardInterrupt
            # What it is shown: the last two messages (a chain's last reply and its feedback,
            # or a child's request with its parents). It grows the cheapest correct one shown,
            # else the last one shown.
            shown = [MARK.findall(str(m.get("content") or "")) for m in messages[-2:]]
            marks = [(int(a), k, float(c)) for found in shown for a, k, c in found]
            good = [m for m in marks if m[1] != "wrong"]
            content = (self.grow(*min(good, key=lambda m: m[2])) if good else
                       self.grow(*marks[-1]) if marks else self.fresh())
        time.sleep(self.delay)
        with self.lock:
            self.calls.append((start, time.time()))
        return ModelReply(content=content, usage=Usage(self.tokens // 2, self.tokens - self.tokens // 2),
                          cost_usd=self.cost, cost_known=True)


class WorldTools:
    """The stand-in harness: the declared cost is the time; Inductor takes 1.0."""

    def __init__(self, delay: float = 0.0, interrupt_at: int | None = None) -> None:
        self.delay = delay
        self.lock = threading.Lock()
        self.evaluated: list[str] = []
        self.verified: list[str] = []
        self.intervals: list[tuple[float, float]] = []
        self.interrupt_at = interrupt_at

    def schemas(self):
        return TOOL_SCHEMAS

    def _obs(self, code: str, full: bool) -> Observation:
        found = MARK.search(code)
        if not found or found.group(2) == "wrong":
            return Observation(text="incorrect: output 0 differs (max abs error 0.5)", verdict="incorrect",
                               code=code, full=full, data={"reason": "output 0 differs (max abs error 0.5)"})
        speed = 1.0 / float(found.group(3))
        return Observation(text=f"correct, {speed:.2f}x vs TorchInductor", verdict="correct", code=code,
                           passed=True, timed=True, measurable=True, speedups={"compile": speed},
                           intervals={"compile": [speed * 0.97, speed * 1.03]}, full=full)

    def run(self, name, arguments):
        return self._obs(arguments.get("code", ""), name == "submit")

    def evaluate(self, code: str) -> Observation:
        start = time.time()
        with self.lock:
            if self.interrupt_at is not None and len(self.evaluated) >= self.interrupt_at:
                raise KeyboardInterrupt
            self.evaluated.append(code)
        time.sleep(self.delay)
        with self.lock:
            self.intervals.append((start, time.time()))
        return self._obs(code, False)

    def verify(self, code: str, *, audit: bool = False) -> Observation:
        self.verified.append(code)
        return self._obs(code, True)


def cost_of(code: str | None) -> float:
    found = MARK.search(code or "")
    return float(found.group(3)) if found and found.group(2) != "wrong" else float("inf")


def run_single(seed: int, calls: int):
    model, tools = WorldModel(seed), WorldTools()
    agent = Agent(model, tools, Prompts(), Budget(max_turns=calls), Trajectory(None),
                  AgentConfig(mode="text", target_speedup=1 / BEST_COST - 0.01))
    return agent.run("system", "task"), model, tools


def run_search(strategy: str, seed: int, calls: int, samples: int = 4, path=None, budget=None, model=None,
               tools=None, tree=None, **search):
    model = model or WorldModel(seed)
    tools = tools or WorldTools()
    budget = budget or Budget(max_turns=calls)
    trajectory = Trajectory(path)
    if tree is not None:
        trajectory.data["messages"] = [{"role": "system", "content": "system"}, {"role": "user", "content": "task"}]
    runner = Search(model, tools, Prompts(), budget, trajectory,
                    AgentConfig(mode="text", target_speedup=1 / BEST_COST - 0.01),
                    SearchConfig(strategy=strategy, samples=samples, seed=seed, **search),
                    system="system", task="task", tree=tree)
    return runner.run(), model, tools, runner


# == more often than single, with the same number of model calls ==========================
@pytest.mark.parametrize("strategy", ["best-of-n", "beam", "evolve"])
def test_each_strategy_finds_the_best_candidate_more_often_than_single(strategy):
    seeds, calls = range(40), 12
    single = 0
    for s in seeds:
        best = run_single(s, calls)[0].best
        single += best is not None and cost_of(best.code) <= BEST_COST
    wins, used = 0, []
    for s in seeds:
        result, model, _tools, _ = run_search(strategy, s, calls)
        used.append(len(model.calls))
        wins += result.best is not None and cost_of(result.best.code) <= BEST_COST
    assert max(used) <= calls  # never more model calls than single had
    assert wins > single + 4, f"{strategy}: {wins}/40 against single's {single}/40"


# == concurrency =========================================================================
def test_a_rounds_model_calls_and_evaluations_run_at_once():
    model, tools = WorldModel(3, delay=0.3), WorldTools(delay=0.3)
    result, model, tools, runner = run_search("best-of-n", 3, 4, samples=4, model=model, tools=tools)
    nodes = [n for n in runner.tree.nodes if n.round == 0]
    assert len(nodes) == 4
    spans = [(n.times["model_start"], n.times["model_end"]) for n in nodes]
    assert all(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(spans) for b in spans[i + 1:]), spans
    evals = sorted(tools.intervals)
    assert len(evals) >= 2 and evals[1][0] < evals[0][1], evals  # evaluations overlapped too
    assert runner.tree.rounds[0]["nodes"] == 4


def test_model_concurrency_bounds_the_calls_at_once():
    model = WorldModel(5, delay=0.15)
    run_search("beam", 5, 6, samples=6, model=model, model_concurrency=2)
    events = sorted([(s, 1) for s, _ in model.calls] + [(e, -1) for _, e in model.calls])
    most, now = 0, 0
    for _, step in events:
        now += step
        most = max(most, now)
    assert most <= 2


# == budgets stop the search exactly =======================================================
@pytest.mark.parametrize("strategy", ["best-of-n", "beam", "evolve"])
def test_the_turn_budget_is_exact(strategy):
    result, model, _tools, runner = run_search(strategy, 11, 7, samples=4)
    if result.stop_reason == "limits":
        assert len(model.calls) == 7 and len(runner.tree.nodes) == 7
    else:  # the target was met first: never more
        assert len(model.calls) <= 7
    assert runner.budget.turns == len(model.calls)


def test_token_and_cost_budgets_stop_the_search():
    budget = Budget(max_turns=None, max_tokens=450)
    result, model, _tools, _ = run_search("beam", 1, 0, samples=3, budget=budget, model_concurrency=1,
                                          model=WorldModel(1, tokens=100))
    assert result.stop_reason in ("limits", "target_met")
    if result.stop_reason == "limits":
        assert len(model.calls) == 5 and budget.tokens == 500  # the 5th call crossed 450; none after
    budget = Budget(max_turns=None, max_cost=0.025)
    result, model, _tools, _ = run_search("evolve", 2, 0, samples=2, budget=budget, model_concurrency=1)
    if result.stop_reason == "limits":
        assert len(model.calls) == 3


# == dedup and memory =======================================================================
class Repeater:
    """Replies with the same module each time, with different comments and spacing."""

    name = "repeater"

    def __init__(self, kind="wrong"):
        self.calls = []

        self.kind = kind

    def query(self, messages, tools=None):
        self.calls.append(messages)
        n = len(self.calls)
        body = module(1, self.kind, 1.0).replace("import torch", f"import torch   # variant {n}\n\n")
        return ModelReply(content=body, usage=Usage(1, 1), cost_known=True)


def test_identical_candidates_are_evaluated_once_and_failures_never_again():
    model, tools = Repeater(), WorldTools()
    result, _, _, runner = run_search("beam", 0, 6, samples=3, model=model, tools=tools)
    assert len(model.calls) == 6
    assert len(tools.evaluated) == 1, "a duplicate (comments and spacing aside) was evaluated again"
    dups = [n for n in runner.tree.nodes if n.duplicate_of is not None]
    assert len(dups) == 5 and all(n.verdict == "incorrect" and not n.passed for n in dups)
    assert "already evaluated" in dups[0].feedback
    assert runner.summary()["spend"]["duplicates_skipped"] == 5


def test_normalised_hash_ignores_comments_and_spacing_only():
    a = "import torch\nclass ModelNew:\n    x = 1  # one\n"
    assert normalised_hash(a) == normalised_hash("import torch\n\n# note\nclass ModelNew:\n  x=1\n")
    assert normalised_hash(a) != normalised_hash(a.replace("x = 1", "x = 2"))


def test_a_childs_prompt_carries_its_parent_and_a_bounded_history_of_failures():
    result, model, tools, runner = run_search("beam", 7, 16, samples=4, history=3)
    children = [n for n in runner.tree.nodes if n.parent is not None]
    assert children
    for child in children:
        parent = runner.tree.nodes[child.parent]
        request = child.messages[-1]["content"]
        assert parent.code.strip() in request and "Its verdict" in request
        listed = request.split("Already tried and failed")[-1] if "Already tried" in request else ""
        assert listed.count("\n- candidate ") <= 3


# == the tree, saved each step; resume without re-spending ===============================
def test_a_killed_search_resumes_without_buying_a_reply_twice(tmp_path):
    path = tmp_path / "trajectory.json"
    with pytest.raises(KeyboardInterrupt):
        run_search("evolve", 4, 12, samples=3, path=path, model=WorldModel(4, interrupt_at=5))
    saved, tree = load(tmp_path)
    replied = [n for n in tree.nodes if n.reply is not None]
    assert len(replied) == 5 and saved["search"]["strategy"] == "evolve"
    from kernelagent.orchestrate.records import restore_spend as _restore_spend

    budget = Budget(max_turns=12)
    _restore_spend(budget, tree, saved["search"]["spend"])
    assert budget.turns == 5
    model = WorldModel(99)
    result, model, tools, runner = run_search("evolve", 4, 12, samples=3, path=path, model=model, tree=tree,
                                              budget=budget)
    total = 5 + len(model.calls)
    assert total <= 12 and budget.turns == total
    if result.stop_reason == "limits":
        assert total == 12
    ids = [n.id for n in runner.tree.nodes]
    assert ids == list(range(len(ids)))
    assert all(n.state in ("done", "failed") for n in runner.tree.nodes)


def test_a_reply_saved_before_its_evaluation_is_evaluated_on_resume_not_asked_again(tmp_path):
    path = tmp_path / "trajectory.json"
    with pytest.raises(KeyboardInterrupt):
        run_search("beam", 6, 8, samples=2, path=path, tools=WorldTools(interrupt_at=1),
                   model_concurrency=1)
    saved, tree = load(tmp_path)
    waiting = [n for n in tree.nodes if n.state == "replied"]
    assert waiting, [n.state for n in tree.nodes]
    from kernelagent.orchestrate.records import restore_spend as _restore_spend

    budget = Budget(max_turns=8)
    _restore_spend(budget, tree, saved["search"]["spend"])
    before = budget.turns
    result, model, tools, runner = run_search("beam", 6, 8, samples=2, path=path, tree=tree, budget=budget)
    redone = runner.tree.nodes[waiting[0].id]
    assert redone.state == "done" and redone.verdict is not None
    assert before + len(model.calls) == budget.turns <= 8


def test_the_tree_is_saved_after_every_node_and_records_read_it(tmp_path):
    path = tmp_path / "trajectory.json"
    seen = []

    class Watching(WorldTools):
        def evaluate(self, code):
            seen.append(len(json.loads(path.read_text())["search"]["nodes"]))
            return super().evaluate(code)

    result, model, tools, runner = run_search("best-of-n", 8, 6, samples=2, path=path, tools=Watching())
    assert seen and seen == sorted(seen) and seen[0] >= 1
    rows = records(tmp_path)
    assert len(rows) == len(runner.tree.nodes)
    for row in rows:
        assert row["messages"][0]["role"] == "system" and row["path"][-1] == row["node"]
        if row["parent"] is not None:
            assert row["path"][-2] == row["parent"]


def test_a_search_on_a_budget_shared_with_earlier_runs_counts_their_turns():
    """A whole model's regions share one budget (issue 43): a search started when 5 of 6 turns are
    spent makes one model call, not six."""
    budget = Budget(max_turns=6)
    budget.turns = 5
    result, model, _tools, runner = run_search("beam", 3, 6, samples=4, budget=budget)
    assert len(model.calls) == 1 and budget.turns == 6 and result.stop_reason in ("limits", "target_met")


# == the winner is re-verified; selection on the lower bound ===============================
def test_the_winner_is_re_verified_with_the_full_trial_count():
    result, model, tools, runner = run_search("beam", 9, 8, samples=4)
    assert result.best is not None and result.best.full
    assert tools.verified and tools.verified[0] == result.best.code


def test_selection_uses_the_lower_bound_not_the_point():
    tree = Tree("beam", 2)
    lucky = tree.add(None, 0, "fresh")
    lucky.state, lucky.passed, lucky.measurable, lucky.code, lucky.code_hash = "done", True, True, "a", "a"
    lucky.speedups, lucky.intervals = {"compile": 1.5}, {"compile": [0.8, 2.2]}
    sure = tree.add(None, 0, "fresh")
    sure.state, sure.passed, sure.measurable, sure.code, sure.code_hash = "done", True, True, "b", "b"
    sure.speedups, sure.intervals = {"compile": 1.3}, {"compile": [1.2, 1.4]}
    assert tree.best() is sure
    from kernelagent.search.strategies import Beam

    plan = Beam(1).plan(tree, 1, 2, random.Random(0))
    assert {e.parent for e in plan} == {sure.id}


def test_resuming_a_search_that_met_its_target_buys_no_more_replies(tmp_path):
    path = tmp_path / "trajectory.json"
    seed = next(s for s in range(40) if run_search("beam", s, 12)[0].stop_reason == "target_met")
    first, _, _, _ = run_search("beam", seed, 12, path=path)
    assert first.stop_reason == "target_met"
    saved, tree = load(tmp_path)
    from kernelagent.orchestrate.records import restore_spend as _restore_spend

    budget = Budget(max_turns=12)
    _restore_spend(budget, tree, saved["search"]["spend"])
    again, model, _, _ = run_search("beam", seed, 12, path=path, tree=tree, budget=budget, model=WorldModel(1))
    assert again.stop_reason == "target_met" and model.calls == []


def test_every_write_to_a_node_is_made_under_the_runners_lock(monkeypatch):
    """save() serialises the whole tree (dataclasses.asdict) from whichever worker thread finished
    a step; a node's `times` written outside the lock meanwhile raised "dictionary changed size
    during iteration" (CI, 2026-11-27, the evolve row above). Every clock reading the runner
    stamps on a node is taken with its lock held."""
    from types import SimpleNamespace

    from kernelagent.search import runner as runner_mod

    model, tools = WorldModel(7, delay=0.02), WorldTools(delay=0.02)
    trajectory = Trajectory(None)
    search = Search(model, tools, Prompts(), Budget(max_turns=8), trajectory,
                    AgentConfig(mode="text", target_speedup=1 / BEST_COST - 0.01),
                    SearchConfig(strategy="evolve", samples=4, seed=7), system="system", task="task")
    unlocked: list[str] = []

    def checked_time() -> float:
        if not search.lock._is_owned():
            unlocked.append(threading.current_thread().name)
        return time.time()

    monkeypatch.setattr(runner_mod, "time", SimpleNamespace(time=checked_time))
    search.run()
    stamped = [n for n in search.tree.nodes if n.times]
    assert stamped and all({"model_start", "model_end"} <= set(n.times) for n in stamped)
    assert not unlocked, f"{len(unlocked)} node clock readings outside the lock"
