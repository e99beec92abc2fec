"""The load and compile stage of a job (`Load`, the job's `load` stage; it gets the job as
seams.LoadJob): the trusted reference builds the problem and records its workload (`ref_ready`)
while the candidate's process imports and compiles the candidate (its `start`, `load` and
`compile` reports, read by server/channels.py, move the stage on); each side against its own
deadline on the job's clock. The checks (server/checks.py) start once both are ready."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernelagent.harness.server.stages import StageTimeout

if TYPE_CHECKING:
    from kernelagent.harness.server.seams import LoadJob


class Load:
    """The reference's workload and the candidate's compiled module, awaited together."""

    def __init__(self, job: LoadJob):
        self.job = job

    def await_ready_and_compiled(self) -> None:
        """Wait for the reference's `ref_ready` (its workload recorded) and the
        candidate's `compiled`, each against its own deadline; StageTimeout past either."""
        job = self.job
        deadline_ref = job.clock() + job.limit("start") + job.limit("load")
        ref_ready = compiled = False
        deadline = job.stage_clock + job.limit(job.stage)
        while not (ref_ready and compiled):
            conns: list[Any] = []
            if not ref_ready:
                conns += [job.to_ref, job.ref_alive_fd]
            if not compiled:
                conns += [job.to_cand, job.cand_alive_fd]
            until = min(deadline if not compiled else float("inf"), deadline_ref if not ref_ready else float("inf"))
            ready = job.wait(conns, until)
            if not ready:
                raise StageTimeout()
            if not ref_ready and (job.to_ref in ready or job.ref_alive_fd in ready):
                message = job.channels.ref_recv({"ref_ready"}, job.clock() + 1)
                job.ready = message
                ref_ready = True
                job.facts.workload = {"input_bytes": message["input_bytes"],
                                          "output_bytes": message["output_bytes"],
                                          "param_bytes": message["param_bytes"], "flops": message["flops"],
                                          "dtype": message["output_dtype"]}
                job.facts.memory["io_bytes"] = message["input_bytes"] + message["output_bytes"]
                job.facts.memory["param_bytes"] = message["param_bytes"]
            if not compiled and (job.to_cand in ready or job.cand_alive_fd in ready):
                job.channels.cand_recv({"compiled"}, job.clock() + 1, stage_deadlines=True)
                compiled = True
                job.facts.compiled = True
            deadline = job.stage_clock + job.limit(job.stage)
