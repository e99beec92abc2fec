"""The search loop: rounds of concurrent model calls and evaluations, one tree, one budget.

Each round the strategy (strategies.py) names up to `samples` expansions. Each expansion is
one model call and, when the reply holds a candidate, one evaluation: the loop's `Model`
protocol, its `ToolExecutor` (text-mode `evaluate`, the same full-trial evaluation and
feedback the single loop uses), its `extract_code` and its exceptions. Within a round the
model calls run at once (at most `model_concurrency`), and each candidate goes to the
harness as soon as its reply is in, so evaluations overlap the other calls and each other
(the evaluator's server admits several jobs: harness/server/gate.py keeps timed loops alone).

Budgets are shared by the whole search. A call starts only while every limit has room: the
turn limit is exact (a call reserves its turn before it starts), and no call starts once the
token, cost or wall limit is reached; calls already in flight then finish and are counted.

The tree is written into trajectory.json after every node. At the end, the best correct nodes
(ranked on the speedup interval's lower bound) are re-verified with the full trial count by
the loop's own `Agent.finish`: with many candidates the fastest-looking one is the likeliest
to have been lucky, so the reported figure is a fresh measurement.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernelagent.agent.budget import Budget, LimitsExceeded
from kernelagent.agent.loop import (Agent, AgentConfig, FormatError, Observation, RunResult, check_target,
                                    extract_code, sha)
from kernelagent.agent.prompts import Prompts, truncate
from kernelagent.agent.trajectory import Trajectory
from kernelagent.models.base import Model, ModelConfigError, ModelError
from kernelagent.search.strategies import Expansion, Strategy, make
from kernelagent.search.tree import Node, Tree, conversation, normalised_hash


@dataclass
class SearchConfig:
    strategy: str = "best-of-n"
    samples: int = 4  # expansions per round
    model_concurrency: int | None = None  # model calls at once (default: samples)
    seed: int = 0  # evolve's draws; each round's generator is (seed, round), so a resume repeats them
    history: int = 6  # failed attempts listed in a child's prompt (the most recent)
    beam_width: int | None = None
    elite: int | None = None


class Search:
    def __init__(self, model: Model, tools: Any, prompts: Prompts, budget: Budget, trajectory: Trajectory,
                 config: AgentConfig, search: SearchConfig, *, system: str, task: str,
                 observer: Callable[..., None] | None = None, tree: Tree | None = None,
                 strategy: Strategy | None = None) -> None:
        self.model, self.tools, self.prompts, self.budget = model, tools, prompts, budget
        self.trajectory, self.config, self.search = trajectory, config, search
        self.system, self.task = system, task
        self.notify = observer or (lambda event, **data: None)
        self.tree = tree or Tree(search.strategy, search.samples,
                                 {"model_concurrency": self.model_concurrency, "seed": search.seed,
                                  "history": search.history, "beam_width": search.beam_width,
                                  "elite": search.elite})
        self.strategy = strategy or make(search.strategy, search.samples, beam_width=search.beam_width,
                                         elite=search.elite)
        self.lock = threading.RLock()
        # Model calls started, each holding its turn: those the budget counted (a budget shared with
        # earlier runs, a whole model's regions, counts theirs too) and those a killed search left
        # unanswered (they are asked again).
        self.started_calls = budget.turns + sum(1 for n in self.tree.nodes if n.state == "planned")
        self.model_slots = threading.Semaphore(self.model_concurrency)
        self.stop: tuple[str, str] | None = None
        self.model_errors: list[str] = []
        self.running: dict[str, threading.Event] = {}  # candidates being evaluated now, by hash
        self.tool_seconds: dict[str, float] = defaultdict(float)
        self.tool_calls: dict[str, int] = defaultdict(int)

    @property
    def model_concurrency(self) -> int:
        return max(1, self.search.model_concurrency or self.search.samples)

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> RunResult:
        if not self.trajectory.messages:
            self.trajectory.add_message({"role": "system", "content": self.system})
            self.trajectory.add_message({"role": "user", "content": self.task})
        self.save()
        best = self.tree.best()
        if best is not None:  # a resumed search that already met its target goes straight to the check
            met, label = check_target(_observation(best), self.config.target_speedup)
            if met and best.measurable:
                self.stop = ("target_met", f"node {best.id} meets the target ({label})")
        try:
            self.resume_pending()
            round_ = max((n.round for n in self.tree.nodes), default=-1) + 1
            while self.stop is None:
                self.round(round_)
                round_ += 1
        except ModelConfigError:
            raise
        stop = self.stop or ("limits", "budget spent")
        self.notify("stop", reason=stop[0], detail=stop[1])
        return self.finish(*stop)

    def resume_pending(self) -> None:
        """Nodes a killed search left unfinished: a reply without a verdict is evaluated (the
        reply is not bought again); a call that never answered is asked again."""
        pending = [n for n in self.tree.nodes if n.state in ("planned", "replied")]
        if not pending:
            return
        self.each(self.finish_node, pending)
        self.close_round(pending[0].round)

    def round(self, round_: int) -> None:
        with self.lock:
            room = self.room()
        if room == 0:
            self.stop = ("limits", self.spent())
            return
        plan = self.strategy.plan(self.tree, round_, min(self.search.samples, room), self.rng(round_))
        self.notify("round", round=round_, planned=len(plan), size=self.tree.size(), best=self.best_obs())
        self.each(lambda e: self.expand(e, round_), plan)
        self.close_round(round_)

    def each(self, fn: Callable[[Any], None], items: list[Any]) -> None:
        """`fn` on every item at once, in daemon threads: Ctrl-C (or an error in one) stops the
        search at once instead of waiting for the model calls in flight (they are abandoned: no
        call starts after it, and the caller kills the harness); the first error is re-raised."""
        errors: list[BaseException] = []

        def work(item: Any) -> None:
            try:
                fn(item)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the loop's thread
                with self.lock:
                    errors.append(exc)
                    if self.stop is None:
                        self.stop = ("error", f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=work, args=(item,), daemon=True, name=f"kernelagent-search-{i}")
                   for i, item in enumerate(items)]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)
        except BaseException:
            with self.lock:
                self.stop = self.stop or ("interrupted", "interrupted")
            raise
        if errors:
            raise errors[0]

    def rng(self, round_: int) -> random.Random:
        return random.Random(self.search.seed * 1_000_003 + round_)

    def close_round(self, round_: int) -> None:
        with self.lock:
            best = self.tree.best()
            nodes = [n for n in self.tree.nodes if n.round == round_]
            summary = {"round": round_, "nodes": len(nodes), "best_node": best.id if best else None,
                       "best_speedup": _speed(best), "best_interval": _interval(best),
                       "round_best_speedup": _speed(max((n for n in nodes if n.passed), key=Node.score,
                                                        default=None)),
                       "spend": self.budget.snapshot(), "ended_at": time.time()}
            self.tree.rounds = [r for r in self.tree.rounds if r["round"] != round_] + [summary]
            if self.stop is None and self.model_errors and all(
                    n.verdict == "model_error" for n in nodes):
                self.stop = ("model_error", self.model_errors[-1])
            self.save()

    # -- one expansion -----------------------------------------------------------------
    def room(self) -> int:
        """How many more model calls may start now (under the lock)."""
        if self.stop is not None:
            return 0
        fractions = self.budget.fractions()
        if any(v >= 1.0 for k, v in fractions.items() if k != "turns"):
            return 0
        if self.budget.max_turns:
            return max(0, self.budget.max_turns - self.started_calls)
        return self.search.samples

    def spent(self) -> str:
        for name, fraction in self.budget.fractions().items():
            if fraction >= 1.0 or (name == "turns" and self.started_calls >= (self.budget.max_turns or 0)):
                return f"{name} budget spent ({self.budget.describe(name)})"
        return "budget spent"

    def expand(self, expansion: Expansion, round_: int) -> None:
        with self.model_slots:
            with self.lock:
                if self.room() == 0:
                    return  # the budget ran out (or the target was met) while this one waited
                self.started_calls += 1
                node = self.tree.add(expansion.parent, round_, expansion.action, chain=expansion.chain,
                                     other_parent=expansion.other_parent)
                node.messages = self.messages_for(node)
                self.save()
            self.ask(node)
        self.judge_node(node)

    def finish_node(self, node: Node) -> None:
        if node.state == "planned":
            with self.model_slots:
                self.ask(node)
        self.judge_node(node)

    def ask(self, node: Node) -> None:
        # Every write to a node is made under the lock: save() serialises the whole tree from any
        # worker thread, and a node's dict that grows meanwhile breaks it ("dictionary changed
        # size during iteration").
        with self.lock:
            node.times["model_start"] = time.time()
        try:
            reply = self.model.query([dict(m) for m in node.messages], None)
        except ModelConfigError:
            with self.lock:
                self.stop = ("model_error", "model configuration")
            raise
        except ModelError as exc:
            with self.lock:
                node.times["model_end"] = time.time()
                self.budget.charge()  # the call took its turn: the turn lines and the stop line agree
                node.state, node.verdict = "failed", "model_error"
                node.feedback = f"model error: {exc}"
                self.model_errors.append(str(exc))
                turn = self.budget.turns
                self.save()
            self.notify("model_error", turn=turn, node=node.id, error=str(exc), budget=self.budget.snapshot())
            return
        with self.lock:
            node.times["model_end"] = time.time()
            self.budget.charge(reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.cost_usd)
            turn = self.budget.turns
            node.reply = {**reply.to_dict(), "raw": reply.raw}
            node.cost.update(prompt_tokens=reply.usage.prompt_tokens,
                             completion_tokens=reply.usage.completion_tokens, usd=reply.cost_usd)
            node.state = "replied"
            self.save()
        self.notify("model", turn=turn, reply=reply, budget=self.budget.snapshot(), node=node.id)

    def judge_node(self, node: Node) -> None:
        if node.state != "replied":
            return
        reply = node.reply or {}
        try:
            code = _code_of(reply)
        except FormatError as exc:
            text = self.prompts.render("format_error", kind=exc.kind, message=str(exc), mode="text")
            with self.lock:
                node.state, node.verdict, node.feedback = "failed", exc.kind, text
                self.save()
            self.notify("tool", tool="reply", obs=Observation(text=text, verdict=exc.kind), best=self.best_obs(),
                        turn=None, node=node.id)
            return
        with self.lock:
            node.code, node.code_hash = code, normalised_hash(code)
        while True:  # the same candidate from two calls of one round is evaluated once
            with self.lock:
                first = self.tree.evaluated(node.code_hash)
                running = self.running.get(node.code_hash)
                if first is None and running is None:
                    self.running[node.code_hash] = threading.Event()
                    break
            if first is not None:
                self.copy_verdict(node, first)
                return
            running.wait()
        try:
            with self.lock:
                node.times["eval_start"] = time.time()
            obs = self.tools.evaluate(code)
        finally:
            with self.lock:
                node.times["eval_end"] = time.time()
                self.running.pop(node.code_hash).set()
        with self.lock:
            self.tool_seconds["evaluate"] += obs.seconds
            self.tool_calls["evaluate"] += 1
            node.verdict, node.passed, node.measurable = obs.verdict, obs.passed, obs.measurable
            node.speedups, node.intervals = dict(obs.speedups), {k: list(v) for k, v in obs.intervals.items()}
            node.feedback, node.harness = obs.text, obs.data
            node.cost["eval_s"] = round(obs.seconds, 3)
            node.state = "done"
            if obs.passed and obs.timed and self.stop is None:
                met, label = check_target(obs, self.config.target_speedup)
                if met:
                    self.stop = ("target_met", f"node {node.id} meets the target ({label})")
            self.save()
        self.notify("tool", tool="evaluate", obs=obs, best=self.best_obs(), turn=None, node=node.id)

    def copy_verdict(self, node: Node, first: Node) -> None:
        with self.lock:
            node.duplicate_of = first.id
            node.verdict, node.passed, node.measurable = first.verdict, first.passed, first.measurable
            node.speedups, node.intervals = dict(first.speedups), dict(first.intervals)
            node.feedback = (f"This module is the same as candidate {first.id} (comments and spacing aside), "
                             f"which was already evaluated; it was not run again. Its verdict:\n{first.feedback}")
            node.state = "done"
            self.tool_calls["duplicate"] += 1
            self.save()
        self.notify("tool", tool="duplicate", obs=Observation(text=node.feedback, verdict=node.verdict,
                                                               passed=node.passed), best=self.best_obs(),
                    turn=None, node=node.id)

    # -- prompts -----------------------------------------------------------------------
    def messages_for(self, node: Node) -> list[dict]:
        root = [{"role": "system", "content": self.system}, {"role": "user", "content": self.task}]
        if node.action == "fresh" or node.parent is None:
            return root
        parent = self.tree.nodes[node.parent]
        if node.action == "continue":  # best-of-n: the chain's own conversation goes on
            return conversation(parent)
        parents = [parent] + ([self.tree.nodes[node.other_parent]] if node.other_parent is not None else [])
        request = self.prompts.render(
            "search_child", action=node.action, history=self.history(exclude={p.id for p in parents}),
            parents=[{"id": p.id, "code": (p.code or "").strip(), "speed": _speed_label(p),
                      "feedback": truncate(p.feedback, 3000, 60)} for p in parents])
        return [root[0], {"role": "user", "content": f"{self.task}\n\n{request}"}]

    def history(self, exclude: set[int]) -> list[str]:
        """The most recent failed attempts, a line each, with why they failed."""
        failed = [n for n in self.tree.nodes if n.state in ("done", "failed") and not n.passed
                  and n.id not in exclude and n.duplicate_of is None and n.verdict != "model_error"]
        lines = []
        for n in failed[-self.search.history:]:
            reason = str((n.harness or {}).get("reason") or "").strip().splitlines()
            why = reason[0] if reason else (n.feedback.strip().splitlines() or [""])[0]
            lines.append(f"candidate {n.id} ({n.action}): {n.verdict}: {why[:200]}")
        return lines

    def seed_initial(self, candidates: dict, obs: Observation) -> None:
        """An existing kernel (regeneration) as node 0: in the population from the first round
        on, and a candidate of the final check, so the search never ends with less than it had."""
        node = self.tree.add(None, 0, "initial")
        node.code = obs.code
        node.code_hash = normalised_hash(obs.code) if obs.code else None
        node.verdict, node.passed, node.measurable = obs.verdict, obs.passed, obs.measurable
        node.speedups, node.intervals = dict(obs.speedups), {k: list(v) for k, v in obs.intervals.items()}
        node.feedback, node.harness, node.state = obs.text, obs.data, "done"
        self.save()

    def summary(self) -> dict[str, Any]:
        """For summary.json and the live view: the rounds, the population, the best, the spend."""
        with self.lock:
            best = self.tree.best()
            top = self.tree.ranked()[:5]
            return {"strategy": self.search.strategy, "samples": self.search.samples,
                    "model_concurrency": self.model_concurrency, "seed": self.search.seed,
                    "size": self.tree.size(),
                    "best": None if best is None else {"node": best.id, "round": best.round, "action": best.action,
                                                       "speedup": _speed(best), "interval": _interval(best),
                                                       "path": [n.id for n in self.tree.path(best.id)]},
                    "best_by_round": [{"round": r["round"], "best_speedup": r.get("best_speedup"),
                                       "best_interval": r.get("best_interval"),
                                       "round_best_speedup": r.get("round_best_speedup"),
                                       "cost_usd": (r.get("spend") or {}).get("cost_usd"),
                                       "tokens": (r.get("spend") or {}).get("tokens"),
                                       "model_calls": (r.get("spend") or {}).get("turns")}
                                      for r in self.tree.rounds],
                    "population": [{"node": n.id, "round": n.round, "verdict": n.verdict, "speedup": _speed(n),
                                    "interval": _interval(n)} for n in top],
                    "spend": {"model_calls": self.budget.turns, "tokens": self.budget.tokens,
                              "cost_usd": round(self.budget.cost, 6), "elapsed_s": round(self.budget.elapsed, 3),
                              "evaluations": self.tool_calls.get("evaluate", 0),
                              "duplicates_skipped": self.tool_calls.get("duplicate", 0)}}

    # -- reading the tree ----------------------------------------------------------------
    def best_obs(self) -> Observation | None:
        with self.lock:
            best = self.tree.best()
        return _observation(best) if best else None

    def save(self) -> None:
        with self.lock:
            self.trajectory.data["search"] = {**self.tree.to_dict(), "spend": self.budget.snapshot(),
                                              "started_calls": self.started_calls}
            self.trajectory.save()

    def finish(self, stop_reason: str, stop_detail: str) -> RunResult:
        """The loop's own final check over the best correct nodes (re-verified, full trials)."""
        agent = Agent(self.model, self.tools, self.prompts, self.budget, self.trajectory, self.config,
                      observer=self.notify)
        for node in self.tree.correct():
            if node.code:
                agent.candidates.setdefault(sha(node.code), (_observation(node), node.id))
        agent.tool_seconds.update(self.tool_seconds)
        agent.tool_calls.update(self.tool_calls)
        judged = sum(1 for n in self.tree.nodes if n.code and n.verdict and n.action != "initial")
        result = agent.finish(stop_reason, stop_detail, judged=judged)
        self.save()
        return result


def _code_of(reply: dict) -> str:
    """The candidate in a reply: its code block, else the `code` of a tool call that carries one."""
    try:
        return extract_code(str(reply.get("content") or ""))
    except FormatError:
        from kernelagent.harness import bounded_json

        for call in reply.get("tool_calls") or []:
            try:
                code = bounded_json.loads((call.get("arguments_json") or "{}").encode("utf-8", "replace")).get("code")
            except (bounded_json.Refused, AttributeError):
                continue
            if isinstance(code, str) and "class ModelNew" in code:
                return code.strip() + "\n"
        raise


def _observation(node: Node) -> Observation:
    """A node as the loop's Observation; `full` is False so that the final check measures it again."""
    return Observation(text=node.feedback, verdict=node.verdict or "", code=node.code, passed=node.passed,
                       timed="candidate" in ((node.harness or {}).get("timings") or {}) or bool(node.speedups),
                       measurable=node.measurable, speedups=dict(node.speedups),
                       intervals={k: list(v) for k, v in node.intervals.items()}, full=False,
                       data=node.harness or {})


def _speed(node: Node | None) -> float | None:
    return node.speed()[1] if node is not None else None


def _interval(node: Node | None) -> list[float] | None:
    return node.speed()[2] if node is not None else None


def _speed_label(node: Node) -> str:
    if not node.passed:
        return node.verdict or ""
    speed, interval = _speed(node), _interval(node)
    if speed is None:
        return "correct"
    bounds = f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else ""
    return f"correct, {speed:.2f}x{bounds} vs TorchInductor"


__all__ = ["LimitsExceeded", "Search", "SearchConfig"]
