"""The verdict fold (kernelagent/harness/verdict.py): a result's status is decided in one pure
function over the outcomes a job recorded, and nowhere else in the harness's server.

`test_fold` drives the fold with outcome rows: every status, every flag severity a Concluded
outcome can carry, every precedence rule. `test_no_status_is_assigned_outside_the_fold` reads
the harness's source (the server's stages, its dispatcher, the precompile, the caller's evaluator
and kernel evidence) for any assignment of a result's status that does not go through the fold
(`verdict.apply_to`, for the server's JobRecord and the caller's EvalResult).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kernelagent.harness import verdict
from kernelagent.harness.result import SEVERITY, Status
from kernelagent.harness.verdict import (Concluded, Failed, HarnessFault, NoNonce, RetryAlone, ServerFault, Verdict,
                                         fold)

PACKAGE = Path(verdict.__file__).resolve().parents[1]

ALL_STATUSES = [v for k, v in vars(Status).items() if k.isupper() and isinstance(v, str)]
REJECT = {"kind": "tampering", "severity": "reject", "message": "forged clock"}
REVIEW = {"kind": "clock-mismatch", "severity": "review", "message": "slow clock"}
INFO = {"kind": "throttling", "severity": "info", "message": "hot"}
LATER = "harness error:\nTraceback: boom"

# (id, outcomes, expected (status, reason, stage, correct), later_fault, fresh)
ROWS = [
    ("nothing", [], (None, "", None, False), None, False),
    *[(f"failed-{s}", [Failed(s, "why", "load")], (s, "why", "load", s == Status.CORRECT), None, False)
      for s in ALL_STATUSES],
    *[(f"concluded-{s}", [Concluded(s, "why", "correctness")], (s, "why", "correctness", s == Status.CORRECT),
       None, False) for s in ALL_STATUSES],
    # the first failure wins over later failures and over the checks' conclusion
    ("first-failure-wins", [Failed(Status.CRASHED, "died", "timing"), Failed(Status.TIMEOUT, "late", "profile")],
     (Status.CRASHED, "died", "timing", False), None, False),
    ("failure-before-checks", [Failed(Status.RUNTIME_ERROR, "raised", "correctness"),
                               Concluded(Status.CORRECT, "", None)],
     (Status.RUNTIME_ERROR, "raised", "correctness", False), None, False),
    ("checks-decide-first", [Concluded(Status.INCORRECT, "trial 0: off", "correctness"),
                             Failed(Status.HARNESS_ERROR, "reference died", "correctness")],
     (Status.INCORRECT, "trial 0: off", "correctness", False), None, False),
    ("second-conclusion-ignored", [Concluded(Status.CORRECT, "", None), Concluded(Status.INCORRECT, "x", "c")],
     (Status.CORRECT, "", None, True), None, False),
    # flag severities on the checks' conclusion: only `reject` changes it, the first one names it
    ("reject-flag-correct", [Concluded(Status.CORRECT, "", None, (INFO, REJECT))],
     (Status.REJECTED, "[tampering] forged clock", "evidence", False), None, False),
    ("reject-flag-incorrect", [Concluded(Status.INCORRECT, "trial 0: off\nmore", "correctness",
                                         (REJECT, {**REJECT, "kind": "hidden-work"}))],
     (Status.REJECTED, "[tampering] forged clock (it was also incorrect: trial 0: off)", "correctness", False),
     None, False),
    ("review-flag", [Concluded(Status.CORRECT, "", None, (REVIEW,))], (Status.CORRECT, "", None, True), None, False),
    ("info-flag", [Concluded(Status.CORRECT, "", None, (INFO,))], (Status.CORRECT, "", None, True), None, False),
    *[(f"reject-flag-leaves-{s}", [Concluded(s, "why", "correctness", (REJECT,))], (s, "why", "correctness", False),
       None, False) for s in (Status.HARNESS_ERROR, Status.BAD_PROBLEM, Status.TIMEOUT, Status.REJECTED)],
    ("reject-flag-after-failure", [Failed(Status.CRASHED, "died", "timing"),
                                   Concluded(Status.CORRECT, "", None, (REJECT,))],
     (Status.CRASHED, "died", "timing", False), None, False),
    # a re-run alone overrides whatever was decided, and keeps the stage
    ("retry-alone-over-timeout", [Failed(Status.TIMEOUT, "late", "compile"), RetryAlone("re-run alone")],
     (Status.HARNESS_ERROR, "re-run alone", "compile", False), None, False),
    ("retry-alone-over-correct", [Concluded(Status.CORRECT, "", None), RetryAlone("memory full")],
     (Status.HARNESS_ERROR, "memory full", None, False), None, False),
    ("retry-alone-twice", [Failed(Status.TIMEOUT, "late", "start"), RetryAlone("first"), RetryAlone("second")],
     (Status.HARNESS_ERROR, "second", "start", False), None, False),
    ("failure-after-retry-ignored", [RetryAlone("alone"), Failed(Status.CRASHED, "died", "timing")],
     (Status.HARNESS_ERROR, "alone", None, False), None, False),
    # a fault of ours that overrides (the fork failed, a cancellation)
    ("harness-fault", [HarnessFault("fork failed")], (Status.HARNESS_ERROR, "fork failed", None, False), None, False),
    ("harness-fault-over-too-large", [Failed(Status.TOO_LARGE, "needs 1 TiB", "start"), HarnessFault("fork failed")],
     (Status.HARNESS_ERROR, "fork failed", "start", False), None, False),
    # no nonce: the reason is replaced, a decided status stays
    ("no-nonce", [NoNonce("no nonce")], (Status.HARNESS_ERROR, "no nonce", None, False), None, False),
    ("no-nonce-keeps-status", [Failed(Status.TOO_LARGE, "needs 1 TiB", "start"), NoNonce("no nonce")],
     (Status.TOO_LARGE, "no nonce", "start", False), None, False),
    # an exception out of the job: a candidate's failure stays, with a later-fault note
    *[(f"server-fault-keeps-{s}", [Failed(s, "its", "timing"), ServerFault(LATER)], (s, "its", "timing", False),
       {"kind": "later-fault", "severity": "info", "message": LATER}, False)
      for s in ALL_STATUSES if s not in (Status.CORRECT, *Status.NOT_JUDGED)],
    ("server-fault-note-is-bounded", [Failed(Status.INCORRECT, "its", "c"), ServerFault("x" * 700 + "END")],
     (Status.INCORRECT, "its", "c", False),
     {"kind": "later-fault", "severity": "info", "message": ("x" * 700 + "END")[-600:]}, False),
    *[(f"server-fault-over-{s}", [Failed(s, "ours", "timing"), ServerFault(LATER)],
       (Status.HARNESS_ERROR, LATER, None, False), None, True) for s in (Status.CORRECT, *Status.NOT_JUDGED)],
    ("server-fault-first", [ServerFault(LATER)], (Status.HARNESS_ERROR, LATER, None, False), None, True),
]


@pytest.mark.parametrize("outcomes, expected, later_fault, fresh", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_fold(outcomes, expected, later_fault, fresh):
    got = fold(outcomes)
    assert (got.status, got.reason, got.stage, got.correct) == expected
    assert got.later_fault == later_fault and got.fresh == fresh


def test_every_status_and_severity_has_rows():
    """The table covers every status a result can have and every flag severity."""
    decided = {r[2][0] for r in ROWS}
    assert set(ALL_STATUSES) <= decided
    assert set(SEVERITY.values()) <= {f["severity"] for f in (REJECT, REVIEW, INFO)}


def test_apply_writes_the_fold_and_only_its_fields():
    """On the server's job record (server/job_record.py), as Job.record does."""
    from kernelagent.harness.server.job_record import JobRecord

    result = JobRecord(flags=[INFO], compiled=True)
    got = verdict.apply_to(result, [Concluded(Status.CORRECT, "", None), RetryAlone("alone")])
    assert got == Verdict(Status.HARNESS_ERROR, "alone", None, False)
    assert result.to_wire() == {**JobRecord(flags=[INFO], compiled=True).to_wire(), "status": Status.HARNESS_ERROR,
                                "reason": "alone", "stage": None, "correct": False}


def test_not_an_outcome_is_refused():
    with pytest.raises(TypeError):
        fold([{"status": Status.CORRECT}])


# -- nothing else assigns a status ---------------------------------------------------------------

# The code the fold governs: the whole harness (its server's stages, main.py's dispatcher, the
# precompile; the caller's evaluator and its kernel evidence). Rooms above the harness (bench,
# cluster, mcpserver) build harness-error dicts of their own and are not scanned.
SCOPE = [PACKAGE / "harness"]
FOLD = PACKAGE / "harness" / "verdict.py"
# (file, line text) -> why it is not a verdict being decided. Keep this short.
ALLOWED: dict[tuple[str, str], str] = {
    ("harness/caller/results.py",
     'summary = {"status": clean_text(result.get("status", ""))[:40], "stage": clean_text(result.get("stage", ""))[:40],'):
        "first_try_summary copies the first try's status into result.concurrency.first_try: a record, not a verdict",
}


def _is_status(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == "status"


def status_assignments(tree: ast.AST) -> list[tuple[int, str]]:
    """Every place a status is written: x["status"] = ..., x.status = ..., x.update(status=...) or
    any call with a `status=` keyword (dataclasses.replace, a constructor), x.update({"status": ...}),
    and any dict literal with a "status" key (a result built by hand)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        flat: list[ast.AST] = []
        while targets:
            target = targets.pop()
            if isinstance(target, (ast.Tuple, ast.List)):
                targets.extend(target.elts)
            else:
                flat.append(target)
        for target in flat:
            if isinstance(target, ast.Subscript) and _is_status(target.slice):
                found.append((node.lineno, "x['status'] = ..."))
            if isinstance(target, ast.Attribute) and target.attr == "status":
                found.append((node.lineno, "x.status = ..."))
        if isinstance(node, ast.Call) and any(k.arg == "status" for k in node.keywords):
            found.append((node.lineno, "call(status=...)"))
        if isinstance(node, ast.Dict) and any(key is not None and _is_status(key) for key in node.keys):
            found.append((node.lineno, "{'status': ...}"))
    return found


def test_no_status_is_assigned_outside_the_fold():
    files = sorted(p for root in SCOPE for p in root.rglob("*.py") if p != FOLD)
    assert {PACKAGE / "harness" / "server" / "job.py", PACKAGE / "harness" / "server" / "main.py",
            PACKAGE / "harness" / "caller" / "evaluator.py", PACKAGE / "harness" / "caller" / "results.py"} <= set(files)
    offenders = []
    for path in files:
        source = path.read_text()
        lines = source.splitlines()
        for lineno, what in status_assignments(ast.parse(source)):
            rel = str(path.relative_to(PACKAGE))
            if (rel, lines[lineno - 1].strip()) not in ALLOWED:
                offenders.append(f"{rel}:{lineno}: {what}: {lines[lineno - 1].strip()}")
    assert not offenders, "a status set outside harness/verdict.py's fold:\n" + "\n".join(offenders)


def test_the_scan_sees_each_form():
    """The scanner finds each form it looks for (and the fold's own writer)."""
    source = ("r['status'] = 1\nr.status = 1\nr.status, r.reason = 1, 2\nr.update(status=1)\n"
              "dataclasses.replace(r, status=1)\nr = {'status': 1}\nr.update({'status': 1})\n")
    assert [line for line, _ in status_assignments(ast.parse(source))] == [1, 2, 3, 4, 5, 6, 7]
    assert len(status_assignments(ast.parse(FOLD.read_text()))) == 2  # the writers: fields() and apply_to()
