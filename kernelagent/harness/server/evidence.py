"""A job's last stage on a GPU: out-of-process kernel evidence (caller/kernel_evidence.py).

Every correct CUDA result that nothing rejected is run once more under Nsight Compute, whose host
process records every kernel the candidate launched and for how long. The run belongs to the job
that asked for it, inside the server, because of the device's timing slot (server/gate.py): ncu
starts the candidate's code in processes of its own, and those put kernels on the device, where a
hostile candidate could spin to slow a neighbour's timed loop.

So the session is split at the candidate's first line. ncu, the interpreter, torch, the CUDA
context and the problem start beside the other jobs (our code only). Then child/ncu_entry.py says
READY and waits; the server takes the timing slot like a timed loop (every other job stopped, the
device idle) and lets it go: the candidate's import, warm-up and profiled calls run with the device
to themselves, and the slot is held until the whole session has ended (nothing of it is left to
run beside a neighbour's loop), bounded by ncu.PROFILED_HOLD_S (caller/ncu.py). Nothing of the
session is ever stopped mid-way (sessions stopped with their job while neighbours timed hung on
an H100). One session's profiled part runs at a time on a host (ncu.ncu_lock, taken at READY
before the slot); the start-ups of several sessions, our code only, run side by side.

The session is jailed like every job (ncu_sandbox with `namespaces=True`: the per-job kernel
namespaces through child/jail_exec.py, with the server's scratch root, the caches and the home
hidden, plus a private /tmp and a loopback for ncu). The evidence is data for the caller, which
judges it against the candidate's source and checked timing (caller/evaluator.py): nothing the
candidate's process says is read here but the report ncu's host process wrote.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Any

from kernelagent.harness.result import Status


def wanted(job: Any) -> bool:
    """Did the caller ask for evidence, and is this a correct GPU result that nothing rejected?

    Results flagged for review are included: such a result is no win already, but a torch-only
    candidate that also trips a review check (its own clock disagreeing with the server's, say)
    must still end `rejected` on what ncu saw, not `correct` with a flag a reader may wave
    through. A result that is not correct pays nothing."""
    options = job.request.get("options") or {}
    if not options.get("evidence") or not job.config.kernel_evidence or not job.fingerprint.get("cuda"):
        return False
    if job.result.get("status") != Status.CORRECT:
        return False
    return not any(isinstance(f, dict) and f.get("severity") == "reject" for f in job.result["flags"])


def session_uid(job: Any) -> tuple[int, int] | None:
    """The uid the ncu session runs as: the job's (child/jail.py job_uid), so that the session,
    which runs the candidate's code again, reads no more than the job itself could (a root-only
    file the minimal view shows, say). None where the job has no uid of its own (the server is
    not root, or the probe found that uid cannot run the job: jail.job_uid says why), or where
    KERNELAGENT_NCU_AS_JOB_UID=0 (then uid 0 outside when the server is root; docs/concepts/isolation.md, "files").
    On an H200 (driver 580) Nsight Compute read the counters as uid 65534; where a driver
    refuses that uid (ERR_NVGPUCTRPERM), the evidence is unavailable, at review, never faked."""
    run_as = (job.jail or {}).get("run_as")
    if not run_as or os.environ.get("KERNELAGENT_NCU_AS_JOB_UID", "1") == "0":
        return None
    return int(run_as[0]), int(run_as[1])


def collect(job: Any) -> None:
    """Run the evidence and put it in the result (`evidence`: {"kernels", "seconds"} or
    {"unavailable": why}). The stage's time is in stage_seconds["evidence"]."""
    from kernelagent.harness.caller import kernel_evidence

    options = job.request.get("options") or {}
    hide = [Path(p) for p in (options.get("evidence") or {}).get("hide", []) if isinstance(p, str)]
    # Everything the job's own jail hides (the server's scratch root with every other job's
    # scratch, the caches, the home), and the caller's list besides.
    hide += [Path(p) for p in (job.jail or {}).get("hide", [])] + [job.root.parent]
    run_as = session_uid(job)
    job.enter("evidence")
    started = time.monotonic()
    try:
        problem = job.root / "evidence-problem.py"
        problem.write_text(job.request["problem_source"])
        # "cuda", no index: the server's CUDA_VISIBLE_DEVICES (the caller's choice) stays as it is.
        evidence = kernel_evidence.collect(
            problem, job.request["candidate_source"], backend=job.config.backend, device="cuda",
            cache_dir=options.get("cuda_cache_dir"), candidate_sha=job.request.get("candidate_sha256", ""),
            timeout=job.limit("evidence"), hide=hide,
            scratch_parent=job.root, namespaces=(job.jail or {}).get("mode") == "namespaces" or None,
            triton_cache=getattr(job, "scratch", job.root / "candidate") / ".triton",
            on_ready=lambda: job.gate.hold(job, job.idle_probe, job.concurrency.setdefault("evidence_slot", {})),
            # one session per host: every job alive here may be ahead of this one, each bounded
            lock_wait_s=job.limit("evidence") * max(1, job.gate.active()), run_as=run_as)
    except Exception:  # noqa: BLE001 - a harness bug is said as such, never the candidate's
        evidence = {"unavailable": "harness error while collecting it:\n" + traceback.format_exc(limit=3)}
    evidence["seconds"] = round(time.monotonic() - started, 3)
    evidence["uid"] = run_as[0] if run_as else os.getuid()  # the session's uid outside
    job.result["evidence"] = evidence
    job.enter("finished")
