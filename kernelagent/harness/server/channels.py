"""A job's two channels, from the server's side (`Channels`, the job's `channels` stage; it
gets the job as seams.ChannelJob): every read of the reference's and of the candidate's pipe,
bounded in time and by the problem's sizes, every send to the candidate, and what each kind of
message means for the verdict."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kernelagent.harness import protocol
from kernelagent.harness.result import Status
from kernelagent.harness.server.processes import describe_exit
from kernelagent.harness.server.stages import CandidateGone, ReferenceGone, StageTimeout, Stop

if TYPE_CHECKING:
    from kernelagent.harness.server.seams import ChannelJob

_START_STAGES = ("start", "load", "compile")
# The candidate's `stage` progress reports, per job: an honest one sends two per check; this many,
# and four more per trial and per extra set.
MAX_STAGE_REPORTS = 256


class Channels:
    """The job's two pipes, read and written here only."""

    def __init__(self, job: ChannelJob):
        self.job = job

    def ref_recv(self, accept: set[str], deadline: float) -> dict[str, Any]:
        job = self.job
        assert job.ref is not None
        while True:
            ready = job.wait([job.to_ref, job.ref_alive_fd], deadline)
            if not ready:
                raise StageTimeout()
            if job.to_ref in ready:
                try:
                    message = protocol.recv(job.to_ref, accept | {"ref_error"}, job.job_id, job.ref_nonce)
                except EOFError:
                    job.ref.join(2)
                    raise ReferenceGone(describe_exit(job.ref.exitcode)) from None
                except protocol.ProtocolError as exc:  # our own process's fault, never the candidate's
                    raise ReferenceGone(f"sent a message the server could not read ({exc})") from None
                if message["type"] == "ref_error":
                    self.ref_error(message)
                return message
            job.ref.join(2)
            raise ReferenceGone(describe_exit(job.ref.exitcode))

    def ref_error(self, message: dict[str, Any]) -> None:
        job = self.job
        if message["kind"] == "bad_problem":
            job.fail(Status.BAD_PROBLEM, "the problem file failed to run:\n" + message["message"], "start")
        elif message["kind"] == "too_large":
            # The machine's limit, never the candidate's: bench shows it as skipped. Beside other
            # jobs it may only be theirs: conclude_concurrency has it re-run alone first.
            job.out_of_memory = True
            job.fail(Status.TOO_LARGE, message["message"], "start")
        else:
            job.fail(Status.HARNESS_ERROR, message["message"], job.stage)
        raise Stop()

    def cand_send(self, msg_type: str, /, *, decided: bool = False, **fields: Any) -> None:
        """A message to the candidate's process. A channel it closed (it exited the moment its
        outputs were handed over, before our reply) is the candidate gone, never our failure:
        the BrokenPipeError was a harness_error, a verdict about nobody. `decided`: a reply
        after a comparison that failed and ends the checks; a candidate gone by then keeps that
        comparison's verdict, so its going is ignored."""
        try:
            protocol.send(self.job.to_cand, msg_type, self.job.job_id, **fields)
        except (BrokenPipeError, ConnectionResetError):
            if not decided:
                raise CandidateGone() from None

    @contextlib.contextmanager
    def reading_candidate(self) -> Iterator[None]:
        """Around a bounded read of the candidate's channel (protocol.read_frame): gone, mid-frame
        included (protocol.TruncatedFrame), is its crash; a frame begun and never finished by
        the deadline is its stage's timeout."""
        try:
            yield
        except EOFError:
            raise CandidateGone() from None
        except protocol.FrameTimeout:
            raise StageTimeout() from None

    def cand_recv(self, accept: set[str], deadline: float, max_bytes: int = protocol.MAX_CANDIDATE_FRAME,
                  stage_deadlines: bool = False) -> dict[str, Any]:
        """The next message from the candidate's process that is one of `accept`. `stage`
        messages are progress reports, accepted only in the order start, load, compile; a
        `failure` ends the job. Anything else is a protocol violation."""
        job = self.job
        assert job.cand is not None
        while True:
            ready = job.wait([job.to_cand, job.cand_alive_fd], deadline)
            if not ready:
                raise StageTimeout()
            if job.to_cand not in ready:
                raise CandidateGone()
            with self.reading_candidate():
                message = protocol.recv(job.to_cand, accept | {"stage", "failure"}, job.job_id, max_bytes=max_bytes,
                                        remaining=lambda end=deadline: end - job.clock(),
                                        bounds=protocol.CANDIDATE_BOUNDS)
            if message["type"] == "failure":
                if not job.ready:
                    # The candidate runs the problem's code too (its inputs): before blaming it,
                    # hear whether the problem itself works. A broken problem is the user's error
                    # (bad_problem, raised from ref_recv), never the candidate's verdict.
                    job.ready = self.ref_recv({"ref_ready"}, job.clock() + job.limit("start"))
                job.failures.candidate_failure(message)
                raise Stop()
            if message["type"] == "stage":
                job.stage_reports += 1
                allowed = MAX_STAGE_REPORTS + 4 * (int((job.ready or {}).get("n_extra", 0)) + job.config.trials)
                if job.stage_reports > allowed:
                    # 300,000 of them before each check's outputs cost the server 50 CPU-seconds
                    raise protocol.ProtocolError(f"more than {allowed} stage reports")
                self.candidate_stage(message["stage"])
                if stage_deadlines:
                    deadline = job.stage_clock + job.limit(job.stage)
                continue
            return message

    def candidate_stage(self, name: str) -> None:
        job = self.job
        if job.stage in _START_STAGES:
            order = list(_START_STAGES)
            if name in order and order.index(name) >= order.index(job.stage):
                if name != job.stage:
                    job.enter(name)
                return
            raise protocol.ProtocolError(f"stage {name[:30]!r} reported during '{job.stage}'")
        # Later stages are the server's to set; the candidate's reports are only checked.
        if name not in ("correctness", "timing", "post-check", "profile", job.stage):
            raise protocol.ProtocolError(f"unknown stage {name[:30]!r}")

    def payload_limit(self, extra: bool = False, kind: str | None = None) -> int:
        """The most bytes one check's (or one kept call's) described tensors may come to: four
        times the set's own inputs and outputs (a wider dtype), plus 16 MiB. The main set and the
        timed calls: the problem's main sizes; a derived set: its own sizes, as the reference
        measured them running it (ref_ready's extra_bytes). An extra set of the problem's own
        get_extra_inputs() (not run ahead) may be larger than the main one: up to one payload
        frame's bound then. (A derived set was bounded by that frame too: 896 MiB of descriptors
        on a small problem's derived set were read and compared.)"""
        ready = self.job.ready or {}
        limit = 4 * (int(ready.get("input_bytes", 0)) + int(ready.get("output_bytes", 0))) + (16 << 20)
        sized = (ready.get("extra_bytes") or {}).get(kind) if kind else None
        if isinstance(sized, int) and not isinstance(sized, bool) and sized >= 0:
            return 4 * sized + (16 << 20)
        if kind in getattr(self.job, "derived_dims", {}):
            return limit  # a derived set the reference did not size: the main set's bound
        return max(limit, protocol.MAX_PAYLOAD_FRAME) if extra else limit

    def relay_payloads(self, records: list[Any], deadline: float, limit: int = protocol.MAX_PAYLOAD_FRAME) -> list[bytes]:
        """The bytes of the tensors the candidate's process described, each frame no longer than
        its record says (the reference then reads no more, and no larger, tensors than its own
        outputs: reference_side._beyond). Beyond that it is the candidate's protocol breach."""
        sizes = [r.get("nbytes") for r in records if isinstance(r, dict) and r.get("kind") == "bytes"]
        if len(sizes) > 512:
            raise protocol.ProtocolError("too many tensors")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes):
            raise protocol.ProtocolError("a tensor description without a byte count")
        if sum(sizes) > limit:  # the server holds them all until the reference has them
            raise protocol.ProtocolError(f"the tensors described come to {sum(sizes):,} bytes, more than the "
                                         f"problem's own outputs and inputs allow ({limit:,}); not read")
        with self.reading_candidate():
            return [protocol.recv_payload(self.job.to_cand, max_bytes=max(n, 1),
                                          remaining=lambda: deadline - self.job.clock())
                    for n in sizes]

