"""A job's failures, and whose each one is (`Failures`, the job's `failures` stage; it gets the
job as seams.FailureJob).

The rules (issue 54, class 5, scope 4):
- Everything the candidate's process says is a claim. Its failure message names a kind, and no
  kind it names makes an infrastructure verdict: "the harness ran out of memory" in its process
  is its own out-of-memory error, and no claim of its buys a re-run alone (`out_of_memory` is set
  only from what the reference, our process, saw: ref_error, its verdicts, its log).
- An exception raised while the server handles the candidate's data (`handling_candidate`) is
  the candidate's protocol breach, never a harness error.
- The reference running out of device memory is ours to explain only while the candidate's
  processes keep to this evaluation's share: where NVML, read by this server, has them holding more
  than the memory ledger promised the whole evaluation, the failure is the candidate's
  (`blame_device_memory`; issue 54's memory hog, which took 139 GiB of an H200 beside a reference).
- The first failure wins: a check the candidate failed stays its verdict when a later step (its
  evidence, a reference that then dies, a fault of ours) goes wrong (`keep_first_failure`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kernelagent.harness import protocol
from kernelagent.harness.result import Status
from kernelagent.harness.server import verdict
from kernelagent.harness.server.gate import process_tree
from kernelagent.harness.server.processes import describe_exit, sandbox_failure

if TYPE_CHECKING:
    from kernelagent.harness.server.seams import FailureJob

# Above the ledger's promise to the whole evaluation by more than this, the candidate's processes
# hold memory that is not theirs to hold (CUDA contexts and the allocator's rounding stay below it).
MEMORY_SLACK = 1 << 30

_STAGES = ("start", "load", "compile", "correctness", "timing", "post-check", "profile")
# What the server may fail at when it reads a message's fields the schema only typed loosely
# (lists and objects of anything): each is the sender's malformed data, here the candidate's.
_DATA_ERRORS = (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError, RecursionError)


class Failures:
    """The job's verdicts about the candidate's failures, and whose each failure is."""

    def __init__(self, job: FailureJob):
        self.job = job

    @contextlib.contextmanager
    def handling_candidate(self, what: str) -> Iterator[None]:
        """Around the server's own reading of a message from the candidate's process: what it
        cannot read there is the candidate's `rejected: protocol`. (An integer of 10**400 in a
        kernels row was an OverflowError there: a harness error, hiding a failed check.)"""
        try:
            yield
        except _DATA_ERRORS as exc:
            raise protocol.ProtocolError(f"its {what} could not be read ({type(exc).__name__}: "
                                         f"{str(exc)[:120]})") from None

    def candidate_failed_check(self) -> bool:
        """A comparison the reference made has already failed for the candidate: outputs that
        differ, or a rejection (a mutated input, a malformed payload), not the reference's own
        fault or a skipped set."""
        for check in self.job.check_records.values():
            if check.passed or check.harness_error or check.skipped:
                continue
            if check.rejected or not check.kind.startswith("extra:"):  # an extra set's is only a flag
                return True
        return False

    def keep_first_failure(self, fault: str) -> None:
        """Before a later fault is recorded: where the candidate has already failed a check, that
        is the verdict (conclude over the checks so far), and the fault is only noted."""
        job = self.job
        if job.facts.status is None and self.candidate_failed_check():
            job.conclude(list(getattr(self.job, "claimed_flags", []) or []))
            job.flag(verdict.flag("later-fault", "after the candidate had failed a check: " + fault[:600], "info"))

    def candidate_failure(self, message: dict[str, Any]) -> None:
        job = self.job
        with self.handling_candidate("failure report"):
            job.facts.flags += verdict.trusted_flags(message["flags"])
            kind, text = str(message["kind"])[:60], str(message["message"])
            stage = message["stage"] if message["stage"] in _STAGES else job.stage
        if kind == "compile_error":
            job.fail(Status.COMPILE_ERROR, text, stage)
        elif kind == "rejected":
            flag_kind = "output-alias" if "shares memory" in text else "output-type" if "output" in text else "rejected"
            job.flag(verdict.flag(flag_kind, text, "reject"))
            job.fail(Status.REJECTED, f"[{flag_kind}] {text}", stage)
        elif kind == "out_of_memory":
            self.note_memory_beside()
            job.fail(Status.RUNTIME_ERROR, "out of memory on the device in the candidate's own code "
                                           f"({job.memory.memory_context()}): " + text, stage)
        elif kind == "harness_out_of_memory":
            # The candidate's process says our input-making there ran out: its word only (its code
            # shares that process and the device), so its verdict, never a harness error.
            job.fail(Status.RUNTIME_ERROR, "out of memory on the device in the candidate's process, making a "
                                           f"check's inputs there ({job.memory.memory_context()}); what that process "
                                           "says is not evidence of a fault of the harness: " + text, stage)
        elif kind == "cuda_fault":
            job.fail(Status.RUNTIME_ERROR, "CUDA fault (illegal memory access or device assert): " + text, stage)
        elif kind == "protocol":
            self.candidate_protocol(text)
        else:
            job.fail(Status.RUNTIME_ERROR, text, stage)

    def note_memory_beside(self) -> None:
        """What our own memory ledger (server/gate.MemoryLedger) had promised to other jobs on
        this device when the candidate's process reported running out: the server's measurement,
        which alone decides whether that failure is re-run alone (job.conclude_concurrency). The
        candidate's report only says when to look."""
        ledger = getattr(self.job, "gate_memory", None)
        used = getattr(ledger, "used", None)
        if isinstance(used, int):
            own = int(self.job.concurrency.get("memory_reserved_bytes") or 0)
            self.job.concurrency["memory_beside_bytes"] = max(0, used - own)

    def blame_device_memory(self) -> bool:
        """The reference (our process) ran out of device memory. The server reads, through NVML,
        what the candidate's processes hold on the device now: more than the ledger's promise to
        this whole evaluation (memory_reserved_bytes) plus MEMORY_SLACK makes the failure the
        candidate's, a runtime_error. Without NVML, a reservation or a reading, nothing is blamed
        and the failure stays ours (re-run alone where it ran beside others)."""
        job = self.job
        reserved = job.concurrency.get("memory_reserved_bytes")
        cand = getattr(self.job, "cand", None)
        if not isinstance(reserved, int) or reserved <= 0 or cand is None or cand.pid is None:
            return False
        held = candidate_device_bytes(job.fingerprint, cand.pid)
        if held is None:
            return False
        job.concurrency["candidate_device_bytes"] = held
        if held <= reserved + MEMORY_SLACK:
            return False
        job.fail(Status.RUNTIME_ERROR, "out of device memory: the reference's process ran out while the candidate's "
                                       f"processes held {held / 2**30:.2f} GiB of the device, more than this "
                                       f"evaluation's whole share ({reserved / 2**30:.2f} GiB, as measured by the "
                                       "harness through NVML); free what the kernel does not need", job.stage)
        return True

    def candidate_protocol(self, text: str) -> None:
        job = self.job
        message = (f"the candidate's process broke the harness protocol during '{job.stage}': {text}; "
                   "a kernel must not write to the harness's channels")
        job.flag(verdict.flag("protocol", message, "reject"))
        job.fail(Status.REJECTED, "[protocol] " + message, job.stage)

    def cand_died(self) -> None:
        job = self.job
        assert job.cand is not None
        job.cand.join(2)
        code = job.cand.exitcode
        if code == 70 and job.stage == "start":
            why = sandbox_failure(getattr(self.job, "cand_log_fd", None))
            job.fail(Status.HARNESS_ERROR, "the candidate's sandbox could not be set up"
                     + (f": {why}" if why else " (see the log)"), "start")
        elif code is None:  # alive, its channel closed: nothing more can be heard from it
            job.fail(Status.CRASHED, f"the candidate's process closed its channel to the server during stage "
                                     f"'{job.stage}' (it was then killed)", job.stage)
        else:
            job.fail(Status.CRASHED, f"the candidate's process {describe_exit(code)} during stage '{job.stage}'",
                     job.stage)


def candidate_device_bytes(fingerprint: dict[str, Any], pid: int) -> int | None:
    """Device memory held now by `pid` and its descendants on the job's device, by NVML (no CUDA
    context here); None where NVML, the device or the processes cannot be found."""
    from kernelagent.harness.child.sm_clocks import read_device

    if not fingerprint.get("cuda"):
        return None
    rows = read_device(fingerprint, lambda nvml, handle: nvml.process_bytes(handle))
    if rows is None:
        return None
    tree = process_tree(pid)
    mine = [size for row_pid, size in rows.items() if row_pid in tree]
    return sum(mine) if mine else None
