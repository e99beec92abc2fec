"""The start of a job (`Start`, the job's `start` stage; it gets the job as seams.StartJob): its
directories and files, the problem it runs (the caller's, or on the CPU its derived-smoke
rewrite), the dict its processes get, its device memory reserved beside other jobs, and the two
processes forked (server/processes.py). Called before the caller sends the job's nonce and before
any secret seed is drawn (Job.run draws them), so neither is in the candidate's memory."""

from __future__ import annotations

import ast
import os
import shutil
import time
from typing import TYPE_CHECKING, Any

from kernelagent import pyast
from kernelagent.devices import first_visible_device
from kernelagent.harness.result import Status
from kernelagent.harness.server import forking, trace_stage
from kernelagent.harness.server.processes import (FORK, candidate_connections, candidate_process, open_log,
                                                   reference_connections, reference_process)

if TYPE_CHECKING:
    from kernelagent.harness.server.seams import StartJob


def static_flags(problem_source: str) -> dict[str, bool]:
    """Whether the problem defines its own smoke inputs and extra input sets."""
    tree = pyast.parse(problem_source)
    names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    return {"has_smoke": "get_smoke_inputs" in names, "has_extra": "get_extra_inputs" in names}


class Start:
    """The job's directories, files and processes."""

    def __init__(self, job: StartJob):
        self.job = job

    def fork(self) -> None:
        """Start the job's two processes (none where the problem is too large for this machine,
        or for a CUDA candidate without a GPU: Job.precompile_only runs then)."""
        job = self.job
        job.started = time.monotonic()
        job.started_epoch = time.time()
        job.thread_cpu0 = time.thread_time()  # this job's thread in the server (finish_result)
        job.scratch = job.root / "candidate"
        job.refdir = job.root / "reference"
        job.scratch.mkdir(parents=True)
        job.refdir.mkdir(parents=True)
        os.chmod(job.root, 0o711)
        os.chmod(job.scratch, 0o700)
        input_set = self.problem()
        if input_set == Status.TOO_LARGE:  # nothing is forked: the verdict is about the machine
            job.facts.device, job.facts.input_set = "cpu", "main"
            job.facts.stage_seconds["total_server"] = time.monotonic() - job.started
            shutil.rmtree(job.root, ignore_errors=True)
            return
        self.files()
        job.child_job = self.child_job()
        job.facts.input_set = input_set
        job.facts.device = job.fingerprint.get("gpu_name", "cpu") if job.fingerprint.get("cuda") else "cpu"
        if job.fingerprint.get("cuda") and job.gate_memory is not None:
            job.memory.reserve_device_memory()
        self.processes()

    def problem(self) -> str:
        """The problem the job runs and its input set: the caller's, or on the CPU (without the
        problem's own smoke inputs) the sizes derived for it; Status.TOO_LARGE when it cannot fit."""
        job = self.job
        flags = static_flags(job.request["problem_source"])
        job.smoke = not job.fingerprint.get("cuda") and job.config.smoke_inputs_on_cpu and flags["has_smoke"]
        input_set = "smoke" if job.smoke else "main"
        job.problem_source = job.request["problem_source"]
        job.facts.derived = {}
        if not job.fingerprint.get("cuda") and job.config.smoke_inputs_on_cpu and not flags["has_smoke"] \
                and job.config.backend != "cuda":
            input_set = job.memory.plan_cpu_inputs()
        job.static_flags = flags  # the derived sets are drawn in run(), after the fork
        return input_set

    def files(self) -> None:
        """The problem and the candidate in the candidate's folder, its log, the problem in the
        reference's folder, and a CUDA candidate's cached builds staged."""
        job = self.job
        (job.refdir / "problem.py").write_text(job.problem_source)
        if job.baselines_only:  # a problem's baselines (job.run_baselines_only): no candidate
            job.cand_log_fd = None
            return
        (job.scratch / "problem.py").write_text(job.problem_source)
        (job.scratch / "candidate.py").write_text(job.request["candidate_source"])
        job.cand_log_fd = open_log(job.scratch / "candidate.log")
        options = job.request.get("options", {})
        if job.config.backend == "cuda" and options.get("cuda_cache_dir") and job.fingerprint.get("cuda"):
            from kernelagent.harness.server import build_cache

            build_cache.stage(options["cuda_cache_dir"], job.request.get("candidate_sha256", ""),
                              job.scratch / ".ka-build-cache")

    def child_job(self) -> dict[str, Any]:
        """What both processes are given of the job (nothing secret: the candidate's holds it)."""
        job = self.job
        options = job.request.get("options", {})
        # Not secret (the candidate's process holds it): the seed of the first, unchecked call.
        job.compile_seed = job.rng.getrandbits(40)
        child_job = {"job_id": job.job_id, "config": job.request["config"],
                     "device": "cuda:0" if job.fingerprint.get("cuda") else "cpu", "smoke": job.smoke,
                     "ipc": options.get("ipc", True), "problem_source": job.problem_source,
                     "candidate_sha256": job.request.get("candidate_sha256", ""),
                     "capability": job.fingerprint.get("capability"), "compile_seed": job.compile_seed,
                     "device_free_bytes": job.fingerprint.get("free_bytes")}
        if job.fingerprint.get("cuda"):
            # Both processes see the server's first GPU only, the one they use (devices.first_visible_device).
            visible = first_visible_device()
            if visible is not None:
                child_job["cuda_visible"] = visible
            job.concurrency["job_visible_devices"] = visible or os.environ.get("CUDA_VISIBLE_DEVICES", "")
        # Each process's CUDA connections (processes.reference_connections, candidate_connections).
        reference = reference_connections()
        if reference:
            child_job["reference_connections"] = reference
        job.concurrency["reference_connections"] = reference or "default"
        if not job.baselines_only:
            connections, said = candidate_connections(job.request["candidate_source"])
            job.concurrency["candidate_connections"] = said
            if connections:
                child_job["cuda_connections"] = connections
        if job.request.get("want_baselines") and job.fingerprint.get("cuda") and job.config.compile_modes:
            # The reference compiles the torch.compile baselines while the candidate is checked
            # (reference_side.start_compiling): they are wanted only if it is correct, but the
            # compile is host work that would otherwise sit on the evaluation's critical path.
            inductor_dir, triton_dir = job.baselines.baseline_dirs()
            child_job["baselines_compile"] = {"compile_modes": list(job.config.compile_modes),
                                              "inductor_dir": str(inductor_dir), "triton_dir": str(triton_dir)}
        return child_job

    def processes(self) -> None:
        """The job's pipes, and its two processes forked and registered with the gate (for a CUDA
        candidate without a GPU, the pipes only: nothing is forked)."""
        job = self.job
        job.to_ref, ref_end = FORK.Pipe()
        job.to_cand, cand_end = FORK.Pipe()
        if job.config.backend == "cuda" and not job.fingerprint.get("cuda") and not job.baselines_only:
            ref_end.close()
            cand_end.close()
            return  # compile-only: precompile_only() runs in this process, nothing is forked
        ref_job, cand_job = trace_stage.open_for(job)  # the kernel trace's channel (issue 55)
        job.ref = FORK.Process(target=reference_process, name="kernelagent-reference",
                               args=(ref_job, ref_end, job.refdir))
        if not job.baselines_only:  # a baselines job has the reference's process only
            job.cand = FORK.Process(target=candidate_process, name="kernelagent-candidate",
                                    args=(cand_job, cand_end, job.scratch, job.jail))
        # No other thread mid-import as the job's processes are forked (server/forking.py).
        job.concurrency["fork_wait_s"] = round(forking.quiet_imports(), 4)
        job.ref.start()
        if job.cand is not None:
            job.cand.start()
        ref_end.close()
        cand_end.close()
        # Liveness through pidfds, not Process.sentinel: the children close every descriptor they
        # inherited, the sentinel pipe's write end included, which would read as a death.
        job.ref_alive_fd = os.pidfd_open(job.ref.pid)
        if job.cand is not None:
            job.cand_alive_fd = os.pidfd_open(job.cand.pid)
        job.gate.register(job)  # from now on a neighbour's timed loop stops these processes too
