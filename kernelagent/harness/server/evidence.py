"""A job's last stage on a GPU: out-of-process kernel evidence (server/kernel_evidence.py).

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
run beside a neighbour's loop), bounded by ncu.PROFILED_HOLD_S (server/ncu.py). Nothing of the
session is ever stopped mid-way (sessions stopped with their job while neighbours timed hung on
an H100). One session's profiled part runs at a time on a device (ncu.ncu_lock keyed by the
device, taken at READY before the slot; `KERNELAGENT_NCU_LOCK=host`: one on the host); the
start-ups of several sessions, our code only, run side by side.

The session is jailed like every job (ncu_sandbox with `namespaces=True`: the per-job kernel
namespaces through jail/exec_in.py, with the server's scratch root, the caches and the home
hidden, plus a private /tmp and a loopback for ncu). The evidence is data for the caller, which
judges it against the candidate's source and checked timing (caller/evaluator.py): nothing the
candidate's process says is read here but the report ncu's host process wrote.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelagent.settings import get as setting
from kernelagent.harness.result import Status
from kernelagent.harness.server import trace_stage

if TYPE_CHECKING:
    from kernelagent.harness.server.seams import EvidenceJob


def ncu_lock_key(fingerprint: dict[str, Any]) -> str | None:
    """The key of this server's Nsight Compute lock: its device's (device_lock.device_key), or
    None (the host's one lock) under `KERNELAGENT_NCU_LOCK=host` or without a device identity."""
    from kernelagent.harness.server.ncu_session import lock_scope
    from kernelagent.harness.server.device_lock import device_key

    return device_key(fingerprint) if lock_scope() == "device" else None


def announce_baselines(job: EvidenceJob) -> None:
    """The job's baselines, to the caller before this stage (seconds of ncu), through the job's
    `on_baselines` (the dispatcher's `baselines_ready`, with the job's nonce): an evaluation of the
    same problem waiting for them (caller/evaluator.py) need not wait for the evidence too."""
    baselines = job.facts.baselines
    send = getattr(job, "on_baselines", None)
    if send is None or not isinstance(baselines, dict) or not baselines.get("timings"):
        return
    try:
        send(baselines)
    except Exception:  # noqa: BLE001 - the result still carries them
        traceback.print_exc()


def asked(job: EvidenceJob) -> bool:
    """Did the caller ask for kernel evidence, on a GPU?"""
    options = job.request.get("options") or {}
    return bool(options.get("evidence")) and bool(job.config.kernel_evidence) and bool(job.fingerprint.get("cuda"))


def traced(job: EvidenceJob) -> bool:
    """Does this job's candidate run under the kernel trace (server/trace_stage.py)?"""
    return getattr(job, "trace_channel", None) is not None or getattr(job, "trace", None) is not None


def audit_asked(job: EvidenceJob) -> bool:
    """Did the caller ask for a Nsight Compute audit of this result (a result shown as a win, or
    the caller's seeded share: server/audit.py)?"""
    options = job.request.get("options") or {}
    evidence_options = options.get("evidence")
    return isinstance(evidence_options, dict) and evidence_options.get("audit") is True


def audit_for_win(job: EvidenceJob) -> bool:
    """A result that beats Inductor, where the caller asked wins to be audited (server/audit.py):
    the candidate's checked median under Inductor's, from the caller's cache (`win_below_ms`) or
    this job's own baselines. Our own measurements on both sides, never the candidate's."""
    from kernelagent.harness.server.audit import inductor_ms

    options = (job.request.get("options") or {}).get("evidence")
    if not isinstance(options, dict) or options.get("audit_wins") is not True:
        return False
    below = options.get("win_below_ms")
    if isinstance(below, bool) or not isinstance(below, (int, float)) or not below > 0:
        below = inductor_ms((job.facts.baselines or {}).get("timings"))
    median = ((job.facts.timings or {}).get("candidate") or {}).get("median_ms")
    return below is not None and isinstance(median, (int, float)) and not isinstance(median, bool) \
        and 0 < median < below


def ncu_planned(job: EvidenceJob) -> bool:
    """Will Nsight Compute run for this job if its result is correct: `evidence="ncu"`, an audit
    the caller asked for, or no trace to judge (the tracer did not load). A trace that turns out
    incomplete falls back to it too (`stage`), but that is known only at the end."""
    return job.config.evidence == "ncu" or audit_asked(job) or not traced(job)


def correct_unrejected(job: EvidenceJob) -> bool:
    """A correct result that nothing rejected. Results flagged for review are included: such a
    result is no win already, but a torch-only candidate that also trips a review check (its own
    clock disagreeing with the server's, say) must still end `rejected` on what the evidence saw,
    not `correct` with a flag a reader may wave through. A result that is not correct pays
    nothing."""
    if job.facts.status != Status.CORRECT:
        return False
    return not any(isinstance(f, dict) and f.get("severity") == "reject" for f in job.facts.flags)


def wanted(job: EvidenceJob) -> bool:
    """Did the caller ask for evidence, and is this a correct GPU result that nothing rejected?"""
    return asked(job) and correct_unrejected(job)


def stage(job: EvidenceJob) -> None:
    """The job's evidence (issue 55), for a result `wanted` says deserves it. The trace of the
    job's own process is judged first (server/trace_stage.judge: pure, milliseconds); Nsight
    Compute runs only where it was planned (`ncu_planned`) or the trace could not decide
    (dropped records, past its bound): its report and its role (`audit`, `fallback` with the
    reason, or `primary` under evidence="ncu") go with the trace's verdict to the caller, which
    applies both (caller/results.py). Without a trace this is today's Nsight Compute stage."""
    if not wanted(job):
        discard(job)
        return
    trace_verdict = trace_stage.judge(job)
    incomplete = (trace_verdict or {}).get("incomplete") or ""
    audited = audit_asked(job) or audit_for_win(job)
    if trace_verdict is not None and not incomplete and not audited and not ncu_planned(job):
        discard(job)
        job.facts.evidence = {"source": "trace", "trace": trace_verdict,
                                  "seconds": trace_verdict["seconds"]}
        return
    announce_baselines(job)
    collect(job)
    report = job.facts.evidence
    if trace_verdict is None:
        report["role"] = "primary" if job.config.evidence == "ncu" else "fallback"
        if job.config.evidence != "ncu":
            report["fallback"] = str((job.fingerprint.get("trace") or {}).get("unavailable")
                                     or "the job's process was not traced")[:300]
    else:
        report["trace"] = trace_verdict
        report["role"] = "fallback" if incomplete else ("audit" if audited else "primary")
        if incomplete:
            report["fallback"] = f"the trace was incomplete: {incomplete}"[:300]


def session_uid(job: EvidenceJob) -> tuple[int, int] | None:
    """The uid the ncu session runs as: the job's (jail/candidate.py job_uid), so that the session,
    which runs the candidate's code again, reads no more than the job itself could (a root-only
    file the minimal view shows, say). None where the job has no uid of its own (the server is
    not root, or the probe found that uid cannot run the job: jail.job_uid says why), or where
    KERNELAGENT_NCU_AS_JOB_UID=0 (then uid 0 outside when the server is root; docs/concepts/isolation.md, "files").
    On an H200 (driver 580) Nsight Compute read the counters as uid 65534; where a driver
    refuses that uid (ERR_NVGPUCTRPERM), the evidence is unavailable, at review, never faked."""
    run_as = (job.jail or {}).get("run_as")
    if not run_as or not setting("KERNELAGENT_NCU_AS_JOB_UID"):
        return None
    return int(run_as[0]), int(run_as[1])


def may_want(job: EvidenceJob) -> bool:
    """Could this job end wanting a Nsight Compute session (before its verdict): the caller asked
    for evidence, the job runs on a GPU, and ncu is planned for it (`ncu_planned`). A traced job
    that is not audited starts no session at all: its trace is the evidence."""
    return asked(job) and ncu_planned(job)


def ncu_primary(job: EvidenceJob) -> bool:
    """Is Nsight Compute this job's evidence itself (evidence="ncu", or no trace to judge), not an
    audit of its trace? Then every job of its problem runs a session."""
    return job.config.evidence == "ncu" or not traced(job)


def starts_early(job: EvidenceJob) -> bool:
    """Does this job start its session beside its checks (`start_early`)? Where ncu is the
    evidence itself (`ncu_primary`), and for an audit of a traced job only while the job is its
    server's one evaluation (a problem's baselines beside it are not counted: a cold `eval`'s
    first job has its problem's baselines compiling beside it): a lone evaluation's result then
    waits only for the profiled part, while under load an audit starts at its evidence stage.
    Nsight Compute's host process keeps a core busy for as long as its target waits at READY, and
    an audit started beside its checks waited there for all of the job's checks and its turn for
    the timing slot (docs/concepts/concurrency.md, "The evidence's host CPU")."""
    if not may_want(job):
        return False
    return ncu_primary(job) or job.gate.evaluations() <= 1


def _hide(job: EvidenceJob) -> list[Path]:
    """Everything the job's own jail hides (the server's scratch root with every other job's
    scratch, the caches, the home), and the caller's list besides."""
    options = job.request.get("options") or {}
    hide = [Path(p) for p in (options.get("evidence") or {}).get("hide", []) if isinstance(p, str)]
    return hide + [Path(p) for p in (job.jail or {}).get("hide", [])] + [job.root.parent]


def _session_settings(job: EvidenceJob) -> dict[str, Any]:
    """What an evidence session of this job is started with, besides its problem and candidate:
    the backend, the jail (what it hides, the per-job namespaces or a probe) and the uid."""
    return dict(backend=job.config.backend, device="cuda", hide=_hide(job),
                namespaces=(job.jail or {}).get("mode") == "namespaces" or None, run_as=session_uid(job))


def start_early(job: EvidenceJob) -> None:
    """Start the job's evidence session now, while its checks run (kernel_evidence.Early): its
    set-up (ncu, the interpreter, torch, the CUDA context, the problem; our code only) is most
    of a session's seconds (docs/concepts/concurrency.md), and a correct result then waits only for
    the profiled part. A job that ends without wanting evidence discards it (`discard`).

    Where a spare waits for this job's problem (started by the job before it: `_start_spare`),
    the job takes it over: its set-up is done before the job began. Then a spare is started for
    the next job of the same problem (an agent's next turn, a search's next sample)."""
    if not starts_early(job) or job.config.profile or getattr(job, "early_evidence", None) is not None:
        return
    from kernelagent.harness.server.ncu import find_ncu

    if find_ncu() is None:  # the late path says so
        return
    profilers = job.gate.profilers
    settings = _session_settings(job)
    # Spares only where every next job of the problem will take one: an audit is a share, and a
    # spare nobody took kept ncu's host process busy for up to SPARE_WAIT_S.
    key = spare_key(job, settings) if ncu_primary(job) else None
    spare = profilers.take_spare(key) if key is not None else None
    if spare is not None:
        job.early_counted = True
        try:
            # Nothing of a candidate's has run in the spare: it waits at READY, and reads its
            # candidate only once let go (child/ncu_entry.py).
            (spare.setup.scratch / "candidate.py").write_text(job.request["candidate_source"])
            spare.spare = True
            job.early_evidence = spare
        except Exception:  # noqa: BLE001 - the spare is ended; the job starts its own below
            traceback.print_exc()
            job.early_evidence = None
            spare.discard()
            _ended(job)
    if job.early_evidence is None:
        # an in-process profile runs or waits: this one starts late; a spare gives up its place
        if not profilers.may_start() and not (profilers.drop_spares() and profilers.may_start()):
            return
        job.early_counted = True
        from kernelagent.harness.server import kernel_evidence

        try:
            problem = job.root / "evidence-problem.py"
            problem.write_text(job.request["problem_source"])
            job.early_evidence = kernel_evidence.start(
                problem, job.request["candidate_source"], candidate_sha=job.request.get("candidate_sha256", ""),
                scratch_parent=job.root, **settings,
                wait_s=job.limit("evidence") + sum(job.limit(s) for s in ("start", "load", "compile", "correctness",
                                                                           "timing", "profile")) + 600)
            if job.early_evidence.setup is None:  # nothing runs: its reason is said when collected
                _ended(job)
        except Exception:  # noqa: BLE001 - the late session (collect) still runs
            traceback.print_exc()
            job.early_evidence = None
            _ended(job)
    if key is not None:
        _start_spare(job, key, settings)


# How long a spare waits at READY for the next job of its problem before it ends by itself (an
# agent's turn is a model call away; a search's next sample comes sooner).
SPARE_WAIT_S = 180.0


def spare_key(job: EvidenceJob, settings: dict[str, Any] | None = None) -> tuple | None:
    """What a spare must share with the job that takes it over: everything its set-up used (the
    problem and the session's settings: the backend, the jail and what it hides, the uid). None
    where no spare may serve: the CUDA backend (the target's build hook is set up for one
    candidate before READY), or spares switched off (KERNELAGENT_EVIDENCE_SPARES=0)."""
    if job.config.backend == "cuda" or not setting("KERNELAGENT_EVIDENCE_SPARES"):
        return None
    settings = settings or _session_settings(job)
    digest = hashlib.sha256(job.request["problem_source"].encode()).hexdigest()
    return (digest, settings["backend"], settings["device"], settings["namespaces"], settings["run_as"],
            tuple(str(p) for p in settings["hide"]))


def _start_spare(job: EvidenceJob, key: tuple, settings: dict[str, Any]) -> None:
    """Start a session for the next job of this job's problem, unless one waits already or the
    cap of live early sessions is reached (a job's own session always comes first). Our code only
    runs in it until a job takes it over; it lives in the server's scratch root (removed with the
    server: the target then gives up within milliseconds) and ends by itself after SPARE_WAIT_S.

    Started from the server's one long-lived spawner thread, never from the job's thread: the
    jail dies with the thread that started it (PR_SET_PDEATHSIG follows the parent thread): a
    spare started by a job's thread would be killed the moment that job ended."""
    profilers = job.gate.profilers
    if profilers.has_spare(key) or not profilers.may_start():
        return
    source, parent = job.request["problem_source"], job.root.parent

    def start() -> None:
        from kernelagent.harness.server import kernel_evidence

        problem = None
        try:
            # the job's own folder may be gone by now: the problem's copy sits in the server's root
            fd, name = tempfile.mkstemp(prefix="evidence-spare-", suffix=".py", dir=parent)
            problem = Path(name)
            with os.fdopen(fd, "w") as f:
                f.write(source)
            spare = kernel_evidence.start(problem, "", candidate_sha="", scratch_parent=parent,
                                          wait_s=SPARE_WAIT_S, **settings)
        except Exception:  # noqa: BLE001 - no spare; the next job starts its own
            traceback.print_exc()
            profilers.ended(early=True)
            return
        finally:
            if problem is not None:
                problem.unlink(missing_ok=True)  # the session has its own copy
        if spare.setup is None:
            profilers.ended(early=True)
            return
        profilers.put_spare(key, spare)

    _spawner().submit(start)


_SPAWNER: Any = None
_SPAWNER_LOCK = threading.Lock()


def _spawner() -> Any:
    """The server's one thread that starts spares; it lives as long as the server."""
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None:
            from concurrent.futures import ThreadPoolExecutor

            _SPAWNER = ThreadPoolExecutor(1, thread_name_prefix="evidence-spares")
        return _SPAWNER


def _ended(job: EvidenceJob) -> None:
    if getattr(job, "early_counted", False):
        job.early_counted = False
        job.gate.profilers.ended(early=True)


def discard(job: EvidenceJob) -> None:
    """The job wants no evidence after all (not correct, or rejected): end its early session."""
    early = getattr(job, "early_evidence", None)
    job.early_evidence = None
    try:
        if early is not None:
            early.discard()
    finally:
        _ended(job)


def covers_device_share(job: EvidenceJob) -> bool:
    """Will the out-of-process evidence judge this job's device share (kernel_evidence.judge:
    `no-custom-kernel`, `hidden-work`), so that the candidate's own process need not profile
    itself for it? Where the caller asked for the evidence and the job is traced (the trace's
    rules judge the share, trace/rules.py) or ncu is installed. Its in-process
    twin (child/candidate_side.py `finish`) only ever repeated that rule, from inside the
    candidate's process, and its profiler must not run beside an ncu session (profilers.py)."""
    if not asked(job):
        return False
    if traced(job):
        return True
    from kernelagent.harness.server.ncu import find_ncu

    return find_ncu() is not None


def collect(job: EvidenceJob) -> None:
    """Run the evidence and put it in the result (`evidence`: {"kernels", "seconds"} or
    {"unavailable": why}). The stage's time is in stage_seconds["evidence"]."""
    from kernelagent.harness.server import kernel_evidence

    options = job.request.get("options") or {}
    settings = _session_settings(job)
    run_as = settings["run_as"]
    job.enter("evidence")
    started = time.monotonic()
    early = getattr(job, "early_evidence", None)
    job.early_evidence = None
    triton_cache = getattr(job, "scratch", job.root / "candidate") / ".triton"
    # one session per device: every job alive here may be ahead of this one, each bounded
    lock_wait_s = job.limit("evidence") * max(1, job.gate.active())
    # Two phases: the slot taken with the other jobs running on while the session warms up
    # (nothing else times meanwhile), then every other job stopped for the profiled calls.
    warm_first = lambda: job.gate.hold(job, job.idle_probe, job.concurrency.setdefault(  # noqa: E731
        "evidence_slot", {}), freeze=False)
    collect_settings = dict(timeout=job.limit("evidence"), on_ready=warm_first, lock_wait_s=lock_wait_s,
                            lock_key=ncu_lock_key(job.fingerprint), triton_cache=triton_cache,
                            cache_dir=options.get("cuda_cache_dir"),
                            candidate_sha=job.request.get("candidate_sha256", ""), backend=job.config.backend,
                            run_as=run_as)
    try:
        if early is not None:
            try:
                evidence = early.collect(**collect_settings)
            finally:
                _ended(job)
        else:
            # Started now (the same session as an early one, its set-up while this job holds
            # nothing): an audit under load, or an early one that could not start beside the checks.
            with job.gate.profilers.session(job, job.limit("evidence")) as clear:
                if not clear:
                    evidence = {"unavailable": "an in-process profile kept the device's profiler past the "
                                               f"evidence's {job.limit('evidence'):.0f} s limit"}
                else:
                    problem = job.root / "evidence-problem.py"
                    problem.write_text(job.request["problem_source"])
                    # "cuda", no index: the server's CUDA_VISIBLE_DEVICES (the caller's choice) stays as it is.
                    late = kernel_evidence.start(
                        problem, job.request["candidate_source"], candidate_sha=job.request.get("candidate_sha256", ""),
                        scratch_parent=job.root, **settings, wait_s=job.limit("evidence") + 60)
                    evidence = late.collect(**collect_settings)
                    if isinstance(evidence.get("phases"), dict):
                        evidence["phases"]["early"] = False
    except Exception:  # noqa: BLE001 - a harness bug is said as such, never the candidate's
        evidence = {"unavailable": "harness error while collecting it:\n" + traceback.format_exc(limit=3)}
    evidence["seconds"] = round(time.monotonic() - started, 3)
    evidence["ncu_lock"] = "device" if collect_settings["lock_key"] else "host"
    evidence["uid"] = run_as[0] if run_as else os.getuid()  # the session's uid outside
    cpu = (evidence.get("phases") or {}).get("cpu_s") if isinstance(evidence.get("phases"), dict) else None
    if isinstance(cpu, (int, float)) and not isinstance(cpu, bool):
        job.cpu["evidence"] = float(cpu)
    job.facts.evidence = evidence
    job.enter("finished")
