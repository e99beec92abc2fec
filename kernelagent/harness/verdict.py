"""Where a result's status is decided: one pure fold over what happened to the evaluation.

The server's stages do not set a status. Each records an outcome (a frozen value below) and
`apply_to` writes the fold of all of them into the job's record (server/job_record.py,
`Job.record`): its status, reason, stage and `correct`, and nothing else writes those; the
caller's EvalResult is written the same way (`apply_to`, `weigh`).
tests/test_verdict_fold.py reads the harness for any other assignment.
The rules, in the order the outcomes happened:

- `Failed` (a stage's failure) and `Concluded` (the checks' verdict, server/verdict.py
  conclude_checks, with the flags it was judged with): the first one decides; a later one is
  ignored. A `Concluded` is the candidate's verdict once explicit evidence of an exploit is
  weighed: its first flag of severity `reject` turns a correct or failed comparison into
  `rejected` (never a harness error, a bad problem, a timeout or a rejection already).
- `RetryAlone` and `HarnessFault`: a harness error of ours that overrides whatever was decided
  (the stage stays); the caller re-runs a `RetryAlone` alone (server/job.conclude_concurrency).
- `NoNonce`: the caller sent no nonce: the reason is replaced, the status stays where one was
  decided, else a harness error.
- `ServerFault`: an exception escaped the job. A candidate's failure decided before it (its
  evidence, the clean-up) stays its verdict, and the fault is only a `later-fault` note; else
  the verdict is a harness error and the job's result is dropped (`fresh`: only the verdict is
  sent).
- `correct` is the status being `correct`, always.

Imports only result.py: it sits on the harness's floor below server/ and caller/.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Union

from kernelagent.harness.result import Status

if TYPE_CHECKING:
    from kernelagent.harness.result import EvalResult

LATER_FAULT_CHARS = 600


@dataclass(frozen=True)
class Failed:
    """A stage's failure: the candidate's (crashed, timeout, rejected, ...) or ours."""

    status: str
    reason: str
    stage: str | None


@dataclass(frozen=True)
class Concluded:
    """What the checks say (server/verdict.py conclude_checks), with the flags the job held then."""

    status: str
    reason: str
    stage: str | None
    flags: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True)
class RetryAlone:
    """A harness error the caller answers by running the job again alone."""

    reason: str


@dataclass(frozen=True)
class HarnessFault:
    """A fault of ours that overrides the verdict (the fork failed, the job was cancelled)."""

    reason: str


@dataclass(frozen=True)
class NoNonce:
    """The caller sent no nonce for the job."""

    reason: str


@dataclass(frozen=True)
class ServerFault:
    """An exception escaped the job's run in the server."""

    reason: str


Outcome = Union[Failed, Concluded, RetryAlone, HarnessFault, NoNonce, ServerFault]


@dataclass(frozen=True)
class Verdict:
    status: str | None = None
    reason: str = ""
    stage: str | None = None
    correct: bool = False
    later_fault: dict[str, str] | None = None  # a ServerFault after the candidate's failure: the note
    fresh: bool = False  # a ServerFault with nothing of the candidate's decided: only the verdict is sent


def with_rejects(status: str | None, reason: str, stage: str | None,
                 flags: Sequence[dict[str, str]]) -> tuple[str | None, str, str | None]:
    """Explicit evidence of an exploit outranks the comparison's verdict (but never a harness
    error or a bad problem, which are not about the candidate, a timeout or a rejection)."""
    rejects = [f for f in flags if f["severity"] == "reject"]
    if not rejects or status in (Status.HARNESS_ERROR, Status.BAD_PROBLEM, Status.TIMEOUT, Status.REJECTED):
        return status, reason, stage
    first = rejects[0]
    also = ""
    if status != Status.CORRECT and reason:
        also = f" (it was also {status}: {reason.splitlines()[0][:300]})"
    return Status.REJECTED, f"[{first['kind']}] {first['message']}{also}", stage or "evidence"


def candidate_failed(status: str | None) -> bool:
    """A verdict about the candidate that is not a pass (compiled counts: it is the candidate's)."""
    return status not in (None, Status.CORRECT, *Status.NOT_JUDGED)


def fold(outcomes: Sequence[Outcome]) -> Verdict:
    """The verdict of outcomes in the order they happened (the module's rules)."""
    status: str | None = None
    reason, stage = "", None
    later_fault: dict[str, str] | None = None
    fresh = False
    for outcome in outcomes:
        if isinstance(outcome, Failed):
            if status is None:
                status, reason, stage = outcome.status, outcome.reason, outcome.stage
        elif isinstance(outcome, Concluded):
            if status is None:
                status, reason, stage = with_rejects(outcome.status, outcome.reason, outcome.stage, outcome.flags)
        elif isinstance(outcome, (RetryAlone, HarnessFault)):
            status, reason = Status.HARNESS_ERROR, outcome.reason
        elif isinstance(outcome, NoNonce):
            status, reason = status or Status.HARNESS_ERROR, outcome.reason
        elif isinstance(outcome, ServerFault):
            if candidate_failed(status):
                later_fault = {"kind": "later-fault", "severity": "info",
                               "message": outcome.reason[-LATER_FAULT_CHARS:]}
            else:
                status, reason, stage, fresh = Status.HARNESS_ERROR, outcome.reason, None, True
        else:
            raise TypeError(f"not an outcome: {outcome!r}")
    return Verdict(status, reason, stage, status == Status.CORRECT, later_fault, fresh)


def fields(verdict: Verdict) -> dict[str, Any]:
    """The result's fields the verdict decides, as a result dict holds them."""
    return {"status": verdict.status, "reason": verdict.reason, "stage": verdict.stage, "correct": verdict.correct}


class Decided(Protocol):
    """What the fold writes on a typed result: the caller's EvalResult, the server's JobRecord."""

    status: str | None
    reason: str
    stage: str | None
    correct: bool


def apply_to(result: Decided, outcomes: Sequence[Outcome]) -> Verdict:
    """The same writer for a typed result (the caller's EvalResult, the server's JobRecord,
    server/job_record.py): its status, reason, stage and `correct`, the fold of `outcomes` alone
    (what the result held before is not an input: `weigh` passes it; the job folds all of its own)."""
    verdict = fold(outcomes)
    result.status, result.reason, result.stage, result.correct = (verdict.status, verdict.reason, verdict.stage,
                                                                  verdict.correct)
    return verdict


def weigh(result: EvalResult, flags: Sequence[dict[str, str]]) -> Verdict:
    """New evidence on a result the server decided (the caller's kernel evidence, its trace, an
    audit): its verdict folded again as the checks' conclusion with these flags, so that a
    `reject` among them outranks the comparison by the same rule (with_rejects)."""
    return apply_to(result, [Concluded(result.status, result.reason, result.stage, tuple(flags))])
