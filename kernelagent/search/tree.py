"""The search's record: a tree of nodes, one per model call, saved after every change.

A node is one model call and the candidate it produced: its parent (None for a fresh start),
the round, what it was asked to do (`action`: fresh, continue, improve, mutate, combine), the
messages it was given, the reply, the candidate, the harness verdict and what it cost. The tree
lives in trajectory.json under "search" (the same file a single run writes), rewritten
atomically after every node, so a killed search resumes from its last complete node
(`--resume DIR`) without paying again for a reply it already has.

Duplicates: candidates are keyed by a normalised hash of their source (comments, blank lines and
spacing do not count). A candidate already evaluated is not evaluated again: its node points at
the first (`duplicate_of`) and shares its verdict, so a candidate that failed is never re-run.
"""

from __future__ import annotations

import hashlib
import io
import json
import tokenize
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT = 1
NOT_JUDGED = ("harness_error", "bad_problem", "too_large")  # harness/result.py Status.NOT_JUDGED


def normalised_hash(code: str) -> str:
    """A hash of the source's tokens: comments, blank lines, indentation width and spacing
    inside a line do not change it; anything the interpreter sees does. Source that does not
    tokenize is hashed as it is, less trailing spaces."""
    try:
        parts = []
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER):
                continue
            if tok.type == tokenize.INDENT:
                parts.append("<indent>")
            elif tok.type == tokenize.DEDENT:
                parts.append("<dedent>")
            elif tok.type == tokenize.NEWLINE:
                parts.append("<nl>")
            else:
                parts.append(tok.string)
        text = "\x00".join(parts)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        text = "\n".join(line.rstrip() for line in code.strip().splitlines())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Node:
    id: int
    parent: int | None
    round: int
    action: str  # fresh | continue | improve | mutate | combine
    chain: int | None = None  # best-of-n: which of the N trajectories
    other_parent: int | None = None  # combine: the second parent
    state: str = "planned"  # planned -> replied -> done (or failed: no candidate)
    messages: list[dict] = field(default_factory=list)  # as the model saw them
    reply: dict | None = None  # ModelReply.to_dict()
    code: str | None = None
    code_hash: str | None = None
    duplicate_of: int | None = None
    verdict: str | None = None  # harness status, or the format error's kind
    passed: bool = False
    measurable: bool = False
    speedups: dict[str, float] = field(default_factory=dict)
    intervals: dict[str, list[float]] = field(default_factory=dict)
    feedback: str = ""  # what the model is shown of the evaluation
    harness: dict = field(default_factory=dict)  # EvalResult.to_dict() (not for duplicates)
    cost: dict = field(default_factory=dict)  # prompt/completion tokens, usd, eval seconds
    times: dict[str, float] = field(default_factory=dict)  # model_start/end, eval_start/end (epoch s)

    def speed(self) -> tuple[str | None, float | None, list[float] | None]:
        """(baseline, point, interval) the node is judged on: TorchInductor, else eager, as the
        loop judges a candidate (agent/loop.py decision_speed); all None when nothing was measured."""
        if not self.measurable:
            return None, None, None
        base = "compile" if "compile" in self.speedups else ("eager" if "eager" in self.speedups else None)
        if base is None:
            return None, None, None
        interval = self.intervals.get(base)
        return base, float(self.speedups[base]), (list(interval) if interval and len(interval) == 2 else None)

    def score(self) -> tuple:
        """Selection order: correct before wrong; among correct, the speedup interval's LOWER
        bound (the point estimate only where no interval was measured), then the point; a
        candidate that ran but was wrong before one that did not build."""
        if self.passed:
            _base, point, interval = self.speed()
            low = interval[0] if interval else (point or 0.0)
            return (2, low, point or 0.0, -self.id)
        ran = self.verdict in ("incorrect", "runtime_error")
        return (1 if ran else 0, 0.0, 0.0, -self.id)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Node":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


class Tree:
    """The nodes, the rounds' summaries, and the strategy's settings; saved into the trajectory."""

    def __init__(self, strategy: str, samples: int, settings: dict[str, Any] | None = None) -> None:
        self.strategy, self.samples = strategy, samples
        self.settings = dict(settings or {})
        self.nodes: list[Node] = []
        self.rounds: list[dict[str, Any]] = []  # per finished round: best so far, spend

    # -- building ----------------------------------------------------------------------
    def add(self, parent: int | None, round_: int, action: str, **extra: Any) -> Node:
        node = Node(id=len(self.nodes), parent=parent, round=round_, action=action, **extra)
        self.nodes.append(node)
        return node

    def evaluated(self, code_hash: str) -> Node | None:
        """The node that judged this candidate first, if any. A harness error is not a verdict
        on the candidate (harness/result.py Status.NOT_JUDGED), so it does not count."""
        for node in self.nodes:
            if node.code_hash == code_hash and node.state == "done" and node.duplicate_of is None \
                    and node.verdict is not None and node.verdict not in NOT_JUDGED:
                return node
        return None

    # -- reading -----------------------------------------------------------------------
    def done(self) -> list[Node]:
        return [n for n in self.nodes if n.state in ("done", "failed")]

    def correct(self) -> list[Node]:
        return [n for n in self.nodes if n.state == "done" and n.passed and n.duplicate_of is None]

    def ranked(self) -> list[Node]:
        """Evaluated nodes, best first (Node.score); duplicates left out."""
        return sorted((n for n in self.done() if n.duplicate_of is None), key=Node.score, reverse=True)

    def best(self) -> Node | None:
        correct = self.correct()
        return max(correct, key=Node.score) if correct else None

    def path(self, node_id: int) -> list[Node]:
        """The nodes from the root to `node_id` (through first parents)."""
        out, seen = [], set()
        current: int | None = node_id
        while current is not None and current not in seen:
            seen.add(current)
            out.append(self.nodes[current])
            current = self.nodes[current].parent
        return out[::-1]

    def size(self) -> dict[str, int]:
        done = self.done()
        return {"nodes": len(self.nodes), "evaluated": sum(1 for n in done if n.duplicate_of is None and n.code),
                "duplicates": sum(1 for n in done if n.duplicate_of is not None),
                "no_candidate": sum(1 for n in done if not n.code), "correct": len(self.correct()),
                "rounds": len(self.rounds)}

    # -- saving ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "strategy": self.strategy, "samples": self.samples,
                "settings": self.settings, "rounds": self.rounds,
                "nodes": [n.to_dict() for n in self.nodes]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Tree":
        tree = cls(data.get("strategy", "best-of-n"), int(data.get("samples", 1)), data.get("settings"))
        tree.rounds = list(data.get("rounds") or [])
        tree.nodes = [Node.from_dict(n) for n in data.get("nodes") or []]
        return tree


def load(run_dir: str | Path) -> tuple[dict[str, Any], Tree]:
    """(trajectory, tree) of a search run folder; ValueError when it holds no search."""
    path = Path(run_dir) / "trajectory.json"
    try:
        trajectory = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(trajectory, dict) or not isinstance(trajectory.get("search"), dict):
        raise ValueError(f"{path}: not a search run (no \"search\" tree); --resume needs a folder "
                         "written by --strategy best-of-n, beam or evolve")
    return trajectory, Tree.from_dict(trajectory["search"])


def conversation(node: Node) -> list[dict]:
    """The node as one chat: the messages it was given, its reply, and the harness's answer."""
    chat = [dict(m) for m in node.messages]
    if node.reply is not None:
        chat.append({"role": "assistant", "content": str(node.reply.get("content") or "")})
    if node.feedback:
        chat.append({"role": "user", "content": node.feedback})
    return chat


def records(run_dir: str | Path) -> list[dict[str, Any]]:
    """One plain record per node of a search run, for datasets and RL: the node's prompt
    (messages), reply, candidate, verdict, speedups with intervals, cost and its ancestry."""
    trajectory, tree = load(run_dir)
    problem = trajectory.get("problem") or {}
    out = []
    for node in tree.nodes:
        if node.state not in ("done", "failed"):
            continue
        source = tree.nodes[node.duplicate_of] if node.duplicate_of is not None else node
        out.append({"run_dir": str(run_dir), "problem": problem, "node": node.id, "parent": node.parent,
                    "other_parent": node.other_parent, "round": node.round, "action": node.action,
                    "path": [n.id for n in tree.path(node.id)], "messages": node.messages,
                    "reply": (node.reply or {}).get("content"), "code": node.code,
                    "code_hash": node.code_hash, "duplicate_of": node.duplicate_of,
                    "verdict": node.verdict, "passed": node.passed, "measurable": node.measurable,
                    "speedups": node.speedups, "intervals": node.intervals, "cost": node.cost,
                    "harness": source.harness})
    return out
