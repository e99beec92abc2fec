"""Evidence from outside the candidate's process (issue 11, scope 7): which kernels really ran,
and for how long, as Nsight Compute saw them.

Everything the candidate's process reports about its kernels (the dispatch recorder, the
torch.profiler rows, the device-time share) comes from code running beside the candidate, which
can switch it off or lie. So every CUDA result that would count as a win is checked once more
(on by default; `--no-kernel-evidence` turns it off, and the result then says nothing outside
saw its kernels): the candidate runs again under `ncu`, jailed (bubblewrap where installed,
else the per-job kernel namespaces through jail/exec_in.py), ncu's
host process records every kernel's name and `gpu__time_duration`, and this module compares
that with facts the caller holds itself:

- the candidate's own kernel names, read statically from its source (Triton `@triton.jit`
  functions, CUDA `__global__` functions), never from its process;
- the timing the server checked on its own clock.

Rules (`judge`, pure):
- no kernel of the candidate's own ran, while device time was spent: `no-custom-kernel` (reject);
- the candidate's own kernels took under half of the device time that was not glue: `hidden-work`
  (reject, as the same rule in the candidate's process, `min_own_device_share`): the heavy work
  ran in library kernels. Glue is a library kernel that is a copy or a fill by its own name
  (demangled or mangled: cuda_source.is_glue_kernel), never one the recorder failed to see;
- the kernels of one call took clearly longer on the device than the reported median
  (over 1.5x plus 5 us): `clock-mismatch` (review).

What this cannot see: ncu's data collection runs partly inside the profiled process (its
injection library), so a candidate that recognises ncu can behave differently under it. The
evidence makes a lie harder, not impossible; the server's clock and the reference's checks stay
the guarantees.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The name rules live in cuda_source (pure, used by the trace's rules too); their old names stay here.
from kernelagent.harness.cuda_source import is_glue, is_own_kernel, short_name, static_own_names  # noqa: F401
from kernelagent.harness.result import SEVERITY

METRICS = ["gpu__time_duration.sum"]
# Profiled forward calls: one. Each call's kernels under ncu cost the frozen device 0.02-0.35 s
# more per call (H200, scripts/device/audit_probe.py); the audit judges which kernels ran and
# their share of the device time, which one call shows as well as two.
CALLS = 1
SLOWER_FACTOR = 1.5
SLOWER_SLACK_MS = 0.005


def split_kernels(kernels: Any, own_names: set[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                              list[dict[str, Any]]]:
    """ncu's kernels that took device time, then the candidate's own among them, then the library
    kernels that are work: glue by their own names (copies, fills; demangled or mangled) is
    allowed beside the candidate's kernels, every other library kernel is work."""
    timed = [k for k in kernels if isinstance(k, dict) and (k.get("total_ns") or 0) > 0] \
        if isinstance(kernels, list) else []
    own = [k for k in timed if is_own_kernel(str(k.get("name", "")), own_names)]
    work = [k for k in timed if k not in own and not is_glue(k)]
    return timed, own, work


def judge(evidence: dict[str, Any], own_names: set[str], median_ms: float | None,
          calls: int = CALLS) -> list[dict[str, str]]:
    """Flags from ncu's kernels (`evidence["kernels"]`: name, launches, total_ns) for `calls`
    profiled forward calls."""
    kernels, own, work = split_kernels(evidence.get("kernels", []), own_names)
    total_ns = sum(k["total_ns"] for k in kernels)
    if not kernels or total_ns <= 0:
        return []
    own_ns = sum(k["total_ns"] for k in own)
    work_ns = sum(k["total_ns"] for k in work)
    top = ", ".join(f"{short_name(k['name'])} ({k['total_ns'] / total_ns:.0%})" for k in (work or kernels)[:3])
    flags: list[dict[str, str]] = []
    if not own:
        flags.append({"kind": "no-custom-kernel", "severity": SEVERITY["no-custom-kernel"],
                      "message": "Nsight Compute, outside the candidate's process, saw none of its own kernels "
                                 f"({', '.join(sorted(own_names)) or 'none found in its source'}) run; the device "
                                 f"time went to {top}: the heavy work must run in the candidate's own kernels"})
    elif own_ns < 0.5 * (own_ns + work_ns):
        flags.append({"kind": "hidden-work", "severity": SEVERITY["hidden-work"],
                      "message": f"Nsight Compute saw the candidate's own kernels take only {own_ns / total_ns:.0%} "
                                 f"of the device time and library kernels other than copies and fills "
                                 f"{work_ns / total_ns:.0%}: {top}; the heavy work must run in the candidate's own "
                                 "kernels"})
    per_call_ms = total_ns / 1e6 / max(calls, 1)
    if median_ms is not None and per_call_ms > SLOWER_FACTOR * median_ms + SLOWER_SLACK_MS:
        flags.append({"kind": "clock-mismatch", "severity": SEVERITY["clock-mismatch"],
                      "message": f"Nsight Compute summed {per_call_ms:.4f} ms of kernel time per call, but the "
                                 f"reported median is {median_ms:.4f} ms"})
    return flags


# What the ncu entry's audit (child/ncu_entry.py: the same Monitor as a job's) may report, and
# the caller turns into rejections as the main run would. Anything else in that line is ignored.
NCU_VIOLATION_KINDS = ("tampering", "sandbox-escape", "reading-reference")


def violations_under_ncu(evidence: dict[str, Any]) -> list[dict[str, str]]:
    """Reject flags for what the candidate did while ncu ran it (evidence["violations"]:
    {kind: [what, ...]}), validated by type and bounded. The line comes from the candidate's own
    process, so it can only be forged against the candidate itself; a candidate that switched
    the monitor off in the main run is still seen here where it does the same again."""
    raw = evidence.get("violations")
    if not isinstance(raw, dict):
        return []
    flags = []
    for kind in NCU_VIOLATION_KINDS:
        items = raw.get(kind)
        if not isinstance(items, list) or not items:
            continue
        said = "; ".join(str(x)[:200] for x in items[:4])
        flags.append({"kind": kind, "severity": SEVERITY[kind],
                      "message": f"seen while Nsight Compute ran the candidate again: {said}"})
    return flags


class Early:
    """An evidence session: ncu, the jail, the interpreter, torch, the CUDA context and the problem
    start at once (our code only: the target waits at READY, child/ncu_entry.py), beside the
    job's checks where server/evidence.py starts it early, else at the job's evidence stage.
    `collect` lets it go holding the device (ncu.run_ncu's `on_ready`: the timing slot, then the
    other jobs stopped for the profiled calls) and runs CALLS forward calls, every kernel they
    launched in its result; `discard` ends it when no evidence is wanted (the candidate failed).
    Started by the server, never by anything a candidate controls."""

    def __init__(self, setup: Any = None, session: Any = None, unavailable: str | None = None):
        self.setup, self.session, self.unavailable = setup, session, unavailable
        self.spare = False  # started ahead for the next job of its problem (server/evidence.py)

    def collect(self, *, timeout: float, on_ready: Any, lock_wait_s: float, triton_cache: Path | None,
                cache_dir: str | Path | None, candidate_sha: str, backend: str,
                run_as: tuple[int, int] | None, lock_key: str | None = None) -> dict[str, Any]:
        import time

        from kernelagent.harness.server import ncu

        if self.setup is None:
            return {"unavailable": self.unavailable or "the session could not be started"}
        started = time.monotonic()
        try:
            self.setup.stage_triton_cache(triton_cache, run_as)
            if backend == "cuda":
                self.setup.stage_build_cache(cache_dir, candidate_sha, run_as)
            try:
                proc = self.session.run(timeout, ncu.with_the_lock(on_ready, lock_wait_s, lock_key))
            except ncu.NcuBusy as exc:
                return ncu.unavailable(exc, lock_wait_s)
            result = ncu.read_session(self.setup, proc, timeout, None, 1000, started)
            result.pop("retry", None)
            result.pop("last", None)
            if "phases" in result:
                result["phases"]["early"] = True
                result["phases"]["spare"] = self.spare
            return result
        finally:
            self.discard()

    def discard(self) -> None:
        """Kill the session (if it still runs) and remove its scratch. Idempotent."""
        session, setup = self.session, self.setup
        self.session = self.setup = None
        if session is not None and session.proc.poll() is None:
            session.kill()
        if setup is not None:
            setup.remove()


def start(problem_path: str | Path, candidate_source: str, *, backend: str, device: str, candidate_sha: str,
          hide: list[Path] | None, scratch_parent: Path | None, namespaces: bool | None,
          run_as: tuple[int, int] | None, wait_s: float) -> Early:
    """An Early session for the kernel evidence, started now
    and held at READY; `wait_s`: the longest it waits there before it gives up by itself (the
    server that would let it go may be gone)."""
    from kernelagent.harness.server import ncu

    setup = ncu.prepare(problem_path, candidate_source, backend=backend, device=device, kernel_names=None,
                        calls=CALLS, cache_dir=None, candidate_sha=candidate_sha, allow_unsandboxed=False,
                        launch_count=100_000, hide=hide, scratch_parent=scratch_parent, namespaces=namespaces,
                        triton_cache=None, clock_control="none", run_as=run_as)
    if isinstance(setup, dict):
        return Early(unavailable=str(setup.get("unavailable")))
    setup.env["KERNELAGENT_NCU_WAIT_S"] = str(int(max(1.0, wait_s)))
    try:
        session = ncu.NcuSession(setup.argv(METRICS), setup.scratch, setup.env, handshake=True, two_phase=True)
    except OSError as exc:
        setup.remove()
        return Early(unavailable=f"ncu could not be started: {exc}")
    return Early(setup, session)
