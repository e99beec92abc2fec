"""What an MCP session may spend: its budgets, reserved when a call is admitted.

Plain Python (no MCP import), so the rules are tested on their own:
- each session (an HTTP client's `Mcp-Session-Id`; a stdio server has one) has a budget of
  evaluations and of evaluation seconds (the wall time of evaluate, profile, plan and verify);
- a call is admitted only with a lease: one evaluation, and a share of the seconds left that no
  other call holds (at most LEASE_S at a time). A call that reaches the end of its share asks
  for more (`Lease.extend`); when none is left, its job is cancelled and it ends with a tool
  error. So calls in flight together can never spend more than the budget: four concurrent
  calls on 12 s share those 12 s, and a call that finds them all reserved is refused at once;
- refusals say what was spent, what is reserved by calls in flight, and what the limit is.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

LEASE_S = 30.0  # seconds a call reserves at a time (it asks for more when it needs them)
MIN_LEASE_S = 1.0  # a share smaller than this is not worth starting a call for


class ToolInputError(ValueError):
    """A bad argument: the message says what to fix (sent as the tool's error, never a traceback)."""


class BudgetSpent(ToolInputError):
    """The session's evaluations or evaluation seconds are spent (or all reserved by calls in flight)."""


@dataclass
class Budget:
    max_evaluations: int | None = None
    max_seconds: float | None = None
    evaluations: int = 0  # admitted calls (a call counts when it is admitted, however it ends)
    seconds: float = 0.0  # spent by calls that ended
    reserved: float = 0.0  # held by calls in flight
    in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def admit(self) -> "Lease":
        """A lease for one call, or BudgetSpent (nothing is reserved then)."""
        with self.lock:
            if self.max_evaluations is not None and self.evaluations >= self.max_evaluations:
                raise BudgetSpent(f"this session's evaluation budget is spent ({self.evaluations}/"
                                  f"{self.max_evaluations} evaluations); start a new session or raise "
                                  "--max-evaluations")
            grant = math.inf
            if self.max_seconds is not None:
                left = self.max_seconds - self.seconds
                if left < MIN_LEASE_S:
                    raise BudgetSpent(f"this session's evaluation time is spent ({self.seconds:.0f}/"
                                      f"{self.max_seconds:.0f} s); start a new session or raise --max-gpu-seconds")
                free = left - self.reserved
                if free < MIN_LEASE_S:
                    raise BudgetSpent(f"the rest of this session's evaluation time ({left:.0f} of "
                                      f"{self.max_seconds:.0f} s) is reserved by {self.in_flight} call(s) in "
                                      "flight; try again when they end")
                grant = min(free, LEASE_S)
                self.reserved += grant
            self.evaluations += 1
            self.in_flight += 1
            return Lease(self, grant)

    def snapshot(self) -> dict:
        with self.lock:
            return {"evaluations": self.evaluations, "max_evaluations": self.max_evaluations,
                    "seconds": round(self.seconds, 3), "reserved_seconds": round(self.reserved, 3),
                    "max_seconds": self.max_seconds, "in_flight": self.in_flight}


class Lease:
    """One admitted call's share of its session's seconds: `deadline` is when it runs out."""

    def __init__(self, budget: Budget, granted: float) -> None:
        self.budget, self.granted = budget, granted
        self.started = time.monotonic()
        self.settled = False

    @property
    def deadline(self) -> float:
        return self.started + self.granted

    def extend(self) -> bool:
        """More of the session's free seconds for this call (up to LEASE_S); False when none is left."""
        budget = self.budget
        with budget.lock:
            if self.settled or budget.max_seconds is None:
                return not self.settled
            free = budget.max_seconds - budget.seconds - budget.reserved
            if free <= 0:
                return False
            more = min(free, LEASE_S)
            self.granted += more
            budget.reserved += more
            return True

    def settle(self) -> float:
        """The call ended: its time (never more than its share) is spent, the rest released."""
        budget = self.budget
        with budget.lock:
            if self.settled:
                return 0.0
            self.settled = True
            used = min(time.monotonic() - self.started, self.granted)
            if math.isfinite(self.granted):
                budget.reserved = max(0.0, budget.reserved - self.granted)
            budget.seconds += used
            budget.in_flight -= 1
            return used


@dataclass
class Sessions:
    """Budgets per client session (a stdio server has one session; HTTP has one per client)."""

    max_evaluations: int | None = None
    max_seconds: float | None = None
    budgets: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def budget(self, key: object) -> Budget:
        with self.lock:
            if key not in self.budgets:
                self.budgets[key] = Budget(self.max_evaluations, self.max_seconds)
            return self.budgets[key]
