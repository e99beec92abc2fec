"""What a run may spend: turns, tokens, dollars, wall seconds. One place decides when to
warn the model and when to stop."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


class LimitsExceeded(Exception):
    """The budget is spent; the run stops and the best candidate so far is kept."""


@dataclass
class Budget:
    max_turns: int = 20
    max_tokens: int | None = None  # prompt + completion, summed over every call
    max_cost: float | None = None  # USD, from litellm's price table (0 for unknown models)
    timeout: float | None = None  # wall seconds for the whole loop
    warn_at: float = 0.75  # fraction of any limit at which the model is warned, once
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    started: float = field(default_factory=time.monotonic)
    warned: bool = False
    warned_last: bool = False

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def charge(self, prompt_tokens: int = 0, completion_tokens: int = 0, cost: float = 0.0) -> None:
        """Count one model call (one turn)."""
        self.turns += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.cost += cost

    def fractions(self) -> dict[str, float]:
        """How much of each limit is used, 0..1+ (only the limits that are set)."""
        used = {"turns": (self.turns, self.max_turns), "tokens": (self.tokens, self.max_tokens),
                "cost": (self.cost, self.max_cost), "time": (self.elapsed, self.timeout)}
        return {k: v / limit for k, (v, limit) in used.items() if limit}

    def check(self) -> None:
        """Raise LimitsExceeded when another model call is not allowed."""
        for name, fraction in self.fractions().items():
            if fraction >= 1.0:
                raise LimitsExceeded(f"{name} budget spent ({self.describe(name)})")

    def describe(self, name: str) -> str:
        return {"turns": f"{self.turns}/{self.max_turns} turns",
                "tokens": f"{self.tokens}/{self.max_tokens} tokens",
                "cost": f"${self.cost:.4f}/${(self.max_cost or 0):.4f}",
                "time": f"{self.elapsed:.0f}/{(self.timeout or 0):.0f} s"}[name]

    def warning(self) -> dict | None:
        """Context for the budget-warning prompt, at most twice a run: when a limit first
        passes `warn_at`, and before the last turn. None when there is nothing to say."""
        fractions = self.fractions()
        if fractions and max(fractions.values()) >= 1.0:
            return None  # spent: there is no next turn to warn about
        last_turn = bool(self.max_turns) and self.turns == self.max_turns - 1
        if last_turn and not self.warned_last:
            self.warned_last = self.warned = True
            return {"last_turn": True, **self.snapshot()}
        if not self.warned and fractions and max(fractions.values()) >= self.warn_at:
            self.warned = True
            name = max(fractions, key=fractions.get)
            return {"last_turn": False, "limit": name, "used": self.describe(name),
                    "percent": int(100 * fractions[name]), **self.snapshot()}
        return None

    def snapshot(self) -> dict:
        return {"turns": self.turns, "max_turns": self.max_turns,
                "turns_left": max(0, self.max_turns - self.turns) if self.max_turns else None,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "tokens": self.tokens, "max_tokens": self.max_tokens,
                "cost_usd": round(self.cost, 6), "max_cost_usd": self.max_cost,
                "elapsed_s": round(self.elapsed, 3), "timeout_s": self.timeout}
