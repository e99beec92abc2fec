"""Which results Nsight Compute audits (issue 55). The kernel trace of the job's own process is
the evidence on every correct GPU result; ncu, a second run outside that process, audits:

- every result the caller asks for (`EvalConfig.audit`): a result a person is shown as a win
  (optimize's final kernel, bench's counted wins, every lock `verify` and `regenerate` write);
- every result that beats Inductor (`EvalConfig.audit_wins`): the server audits where it knows
  Inductor's time (`win_below_ms`, from the cache, or its own baselines); where it did not (the
  baselines were timed by another evaluation meanwhile), the caller evaluates a win once more with
  `audit` (`needs_win_audit`);
- a share of the rest (`EvalConfig.audit_share`, 10% by default), drawn per candidate with a key
  this process made at random: a candidate cannot know whether it will be audited, and the same
  candidate draws the same way within one run;
- every result under `EvalConfig.evidence == "ncu"` (the server runs ncu then whatever this says).

The server runs ncu anyway where the trace cannot decide (no tracer, records dropped)."""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from typing import Any

from kernelagent.harness.config import EvalConfig
from kernelagent.harness.result import EvalResult, Status

_KEY = secrets.token_bytes(32)


def audit_drawn(config: EvalConfig, candidate_sha256: str, key: bytes = _KEY) -> bool:
    """Is this candidate's result audited: asked for, or drawn into the share."""
    if config.audit or config.evidence == "ncu":
        return True
    if config.audit_share <= 0:
        return False
    digest = hmac.new(key, candidate_sha256.encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64 < config.audit_share


def inductor_ms(timings: object) -> float | None:
    """Inductor's default mode's median (ms) from a baselines' `timings`, validated; None if none."""
    entry = timings.get("compile") if isinstance(timings, dict) else None
    value = entry.get("median_ms") if isinstance(entry, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def evidence_options(config: EvalConfig, candidate_sha256: str, cached: dict[str, Any] | None,
                     hide: list[str]) -> dict[str, Any]:
    """The request's `evidence` options: what the evidence's jail hides besides the job's, whether
    this result is audited, and the Inductor time under which the server audits it as a win."""
    options: dict[str, Any] = {"hide": hide, "audit": audit_drawn(config, candidate_sha256)}
    if config.audit_wins:
        options["audit_wins"] = True
        below = inductor_ms((cached or {}).get("timings"))
        if below is not None:
            options["win_below_ms"] = below
    return options


def needs_win_audit(result: EvalResult, config: EvalConfig) -> bool:
    """A correct GPU result, judged on its trace alone, that beats Inductor by the caller's own
    baselines: the server did not know it was a win, so the caller audits it with a second
    evaluation (`audit`)."""
    return (config.kernel_evidence and config.audit_wins and not config.audit and result.status == Status.CORRECT
            and bool((result.fingerprint or {}).get("cuda"))
            and (result.kernel_evidence or {}).get("source") == "trace"
            and (result.speedups or {}).get("compile", 0.0) > 1.0)
