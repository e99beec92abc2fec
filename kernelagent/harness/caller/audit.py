"""Which results Nsight Compute audits (issue 55). The kernel trace of the job's own process is
the evidence on every correct GPU result; ncu, a second run outside that process, audits:

- every result the caller asks for (`EvalConfig.audit`): a result a person is shown as a win
  (optimize's final kernel, bench's counted wins, every lock `verify` and `regenerate` write);
- a share of the rest (`EvalConfig.audit_share`, 10% by default), drawn per candidate with a key
  this process made at random: a candidate cannot know whether it will be audited, and the same
  candidate draws the same way within one run;
- every result under `EvalConfig.evidence == "ncu"` (the server runs ncu then whatever this says).

The server runs ncu anyway where the trace cannot decide (no tracer, records dropped)."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from kernelagent.harness.config import EvalConfig

_KEY = secrets.token_bytes(32)


def audit_drawn(config: EvalConfig, candidate_sha256: str, key: bytes = _KEY) -> bool:
    """Is this candidate's result audited: asked for, or drawn into the share."""
    if config.audit or config.evidence == "ncu":
        return True
    if config.audit_share <= 0:
        return False
    digest = hmac.new(key, candidate_sha256.encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64 < config.audit_share
