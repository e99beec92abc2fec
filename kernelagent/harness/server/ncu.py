"""Nsight Compute, run from outside the candidate's process: finding ncu, jailing the session
it starts (bubblewrap, else the per-job kernel namespaces through jail/exec_in.py), one
session per host, the handshake that lets the harness server hold the device's timing slot for
the candidate's part, and reading ncu's report. Used by `kernelagent profile`
(caller/profiling.py) and by the kernel evidence (server/kernel_evidence.py, server/evidence.py).
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable

from kernelagent import settings
from kernelagent.devices import first_visible_device
from kernelagent.harness import bounded_json
from kernelagent.harness import interpreter
from kernelagent.harness.server.ncu_session import (  # noqa: F401 - also this module's names
    PROFILED_HOLD_S, NcuBusy, NcuLockRefused, NcuSession, busy_report, kill_session, ncu_lock, reap, run_counted,
    run_session, unavailable, with_the_lock)
from kernelagent.harness.child.ncu_entry import GO_FILE  # stdlib-only at import: cheap

NCU_METRICS = [
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_static",
    "launch__shared_mem_per_block_dynamic",
    "launch__block_size",
    "launch__grid_size",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_blocks",
    "launch__occupancy_limit_warps",
]
NCU_STALLS = r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
_STALL_RE = re.compile(r"smsp__average_warps_issue_stalled_(.+)_per_issue_active\.ratio")


def find_ncu() -> str | None:
    named = settings.get("KERNELAGENT_NCU")
    for path in (str(named) if named else None, shutil.which("ncu"), "/usr/local/cuda/bin/ncu"):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


# --------------------------------------------------------------------------------------
# Nsight Compute
# --------------------------------------------------------------------------------------



def parse_ncu_csv(text: str) -> list[dict[str, Any]]:
    """Rows of `ncu --import R --csv --page raw`: one dict per profiled launch (metric -> value),
    with "Kernel Name". The second row (units) is skipped."""
    start = text.find('"ID"')
    if start < 0:
        return []
    rows = list(csv.reader(io.StringIO(text[start:])))
    if len(rows) < 2:
        return []
    header = rows[0]
    out = []
    scale: dict[str, float] = {}
    for row in rows[1:]:
        if len(row) != len(header):
            continue
        record = dict(zip(header, row))
        if not record.get("ID", "").strip().isdigit():
            # the units row: times in nanoseconds, whatever ncu chose to print
            # (its default scales each value: a 4 ms kernel's gpu__time_duration came as "msecond")
            scale = {name: UNIT_SCALE[unit.strip()] for name, unit in record.items()
                     if unit.strip() in UNIT_SCALE and UNIT_SCALE[unit.strip()] != 1}
            continue
        for name, factor in scale.items():
            value = _num(record.get(name))
            if value is not None:
                record[name] = repr(value * factor)
        out.append(record)
    return out


# ncu's time units, to nanoseconds (`--print-units base` asks for nanoseconds and bytes; an ncu
# that ignores it still scales times, which are converted here; sizes are read as printed).
UNIT_SCALE = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9}


def _num(value: object) -> float | None:
    try:
        return float(str(value).replace(",", ""))
    except (TypeError, ValueError):
        return None


def summarise_ncu(records: list[dict[str, Any]], top: int = 3) -> list[dict[str, Any]]:
    """Per kernel (by name): the metrics averaged over its launches, largest total time first."""
    from kernelagent.harness.cuda_source import kernel_base_name

    groups: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        groups.setdefault(rec.get("Kernel Name") or rec.get("Function Name") or "?", []).append(rec)
    kernels = []
    for name, recs in groups.items():
        def avg(metric: str) -> float | None:
            values = [v for v in (_num(r.get(metric)) for r in recs) if v is not None]
            return sum(values) / len(values) if values else None

        stalls = {}
        for metric in recs[0]:
            m = _STALL_RE.fullmatch(metric)
            if m and not m.group(1).endswith("_not_issued"):
                value = avg(metric)
                if value:
                    stalls[m.group(1)] = value
        total_stall = sum(stalls.values()) or 1.0
        top_stalls = sorted(stalls.items(), key=lambda kv: -kv[1])[:3]
        limits = {k: avg(f"launch__occupancy_limit_{k}") for k in ("registers", "shared_mem", "blocks", "warps")}
        known = {k: v for k, v in limits.items() if v is not None}
        limiter = min(known, key=lambda k: known[k]) if known else None
        duration = avg("gpu__time_duration.sum")
        kernels.append({
            "name": name, "base_name": kernel_base_name(name), "launches": len(recs),
            "mangled": recs[0].get("Mangled Name") or "",
            "time_ns": duration, "total_ns": (duration or 0) * len(recs),
            "dram_pct": avg("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            "sm_pct": avg("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
            "memory_pct": avg("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
            "achieved_occupancy_pct": avg("sm__warps_active.avg.pct_of_peak_sustained_active"),
            "theoretical_occupancy_pct": avg("sm__maximum_warps_per_active_cycle_pct"),
            "registers_per_thread": avg("launch__registers_per_thread"),
            "smem_per_block": (avg("launch__shared_mem_per_block_static") or 0)
            + (avg("launch__shared_mem_per_block_dynamic") or 0),
            "block_size": avg("launch__block_size"), "grid_size": avg("launch__grid_size"),
            "occupancy_limiter": limiter, "occupancy_limits": known,
            "top_stalls": [{"reason": r, "share": v / total_stall} for r, v in top_stalls],
        })
    kernels.sort(key=lambda k: -(k["total_ns"] or 0))
    return kernels[:top]


UNSANDBOXED_NCU = ("ncu would run the candidate outside any sandbox here (neither bubblewrap nor kernel namespaces "
                   "work on this machine, and ncu runs its target itself): pass --ncu to allow that for a "
                   "candidate you trust")


def ncu_sandbox(scratch: Path, allow_unsandboxed: bool, hide: list[Path] | None = None,
                namespaces: bool | None = None,
                run_as: tuple[int, int] | None = None) -> tuple[list[str] | None, str | None]:
    """(the prefix ncu runs under, None) or (None, why ncu must not run).

    ncu starts the candidate's code itself, outside the harness server's per-job jail, so it
    gets a jail of its own: bubblewrap where it is installed (a read-only root, the home hidden,
    only its scratch writable, its own pid/net/ipc namespaces, no capabilities), else the
    per-job jail itself entered by jail/exec_in.py (the same kernel namespaces every job
    gets, plus a private /tmp and a loopback for ncu). Without either it runs only when the user
    asked for it explicitly (`--ncu`): the candidate could otherwise read the caller's
    environment and files. namespaces: True where the caller knows the per-job jail works (the
    harness server, whose jobs use it, and which may itself run inside bubblewrap): it is then
    used first; None: probe. run_as: the (uid, gid) the session runs as in the per-job jail (a
    root caller; server/evidence.py says when)."""
    from kernelagent.harness.jail import sandbox

    if not namespaces:
        prefix = sandbox.bubblewrap_command(scratch)
        if prefix is not None:
            return prefix, None
    if namespaces or namespaces_work():
        home = Path(os.path.expanduser("~")).resolve()
        hidden = [Path(p) for p in (hide or [])] + [scratch.parent]
        if str(home) not in ("/", "") and home.is_dir():
            hidden.append(home)
        argv = interpreter.module_argv("kernelagent.harness.jail.exec_in", "--scratch", str(scratch))
        if run_as is not None:
            argv += ["--run-as", f"{int(run_as[0])}:{int(run_as[1])}"]
        for path in dict.fromkeys(p.resolve() for p in hidden):
            # Directories only (the jail hides directories), never the scratch or the root itself.
            if path.is_dir() and path not in (scratch.resolve(), Path("/")) and scratch.resolve() not in path.parents:
                argv += ["--hide", str(path)]
        # The top-level directories, as every job's jail hides them: listed as the jail is entered.
        return argv + ["--hide-tops", "--"], None
    if allow_unsandboxed:
        return [], None
    return None, UNSANDBOXED_NCU


_NAMESPACES: dict[str, bool] = {}


def namespaces_work() -> bool:
    """Does the per-job jail work in this process's world (probed once, in forked children)?"""
    if settings.get("KERNELAGENT_NCU_NO_NAMESPACES"):  # tests: the machine without them
        return False
    if "work" not in _NAMESPACES:
        from kernelagent.harness.jail import probe as jail_probe

        try:
            _NAMESPACES["work"] = bool(jail_probe.probe().get("namespaces_work"))
        except Exception:  # noqa: BLE001 - a probe that breaks means they do not work here
            _NAMESPACES["work"] = False
    return _NAMESPACES["work"]


def run_ncu(problem_path: str | Path, candidate_source: str, backend: str = "triton", device: str = "cuda:0",
            kernel_names: list[str] | None = None, calls: int = 2, timeout: float = 180.0,
            cache_dir: str | Path | None = None, candidate_sha: str = "",
            allow_unsandboxed: bool = False, metric_sets: list[list[str]] | None = None,
            top: int = 3, launch_count: int | None = None, hide: list[Path] | None = None,
            on_spawn: Callable[[int | None], None] | None = None,
            scratch_parent: Path | None = None, namespaces: bool | None = None,
            triton_cache: Path | None = None, clock_control: str = "base",
            on_ready: Callable[[], Any] | None = None, lock_wait_s: float | None = None,
            lock_key: str | None = None,
            run_as: tuple[int, int] | None = None) -> dict[str, Any]:
    """Nsight Compute metrics for the top kernels: {"kernels": [...]} or {"unavailable": why}.
    metric_sets: the metric lists to try in turn (default: the profile's, with stalls first);
    launch_count: how many launches ncu profiles (default 8 per call); hide: directories the
    candidate must not see (the caller's caches and scratch), besides the home; on_spawn: told
    each ncu process's pid (the leader of a session of its own) when it starts, and None when it
    has ended (the harness server stops it while a neighbour times: server/evidence.py);
    scratch_parent: where the scratch is made (default: the temp directory); namespaces: see
    ncu_sandbox; triton_cache: this candidate's own Triton cache from its evaluation, copied
    into the scratch so that its kernels are not compiled again under ncu (its own files: it
    can only mislead itself with them); clock_control: ncu's --clock-control ("base" locks the
    GPU's clocks for repeatable metrics, for the whole device: "none" where other evaluations
    share it, as the kernel evidence does); on_ready: see run_session; lock_wait_s: how long to
    wait for another session to finish (default: `timeout`), not counted in `timeout`; lock_key:
    the device whose lock to take (ncu_session.ncu_lock; None: the host's).

    One ncu session profiles at a time on a device (`ncu_lock`): Nsight Compute serialises its
    sessions through a lock file in /tmp, which a jailed session's private /tmp no longer shares
    (ncu does not support two sessions profiling one device at once). A harness server's
    kernel evidence takes its device's lock (`lock_key`), so the servers of several GPUs profile
    at once; a session without a key (the caller's `profile`) takes the host's, and waits for
    every device's. With `on_ready` (the server's handshake) the lock covers the profiled part
    only, from the target's READY to the session's end; without it, the whole session."""
    started = time.monotonic()
    setup = prepare(problem_path, candidate_source, backend=backend, device=device, kernel_names=kernel_names,
                    calls=calls, cache_dir=cache_dir, candidate_sha=candidate_sha,
                    allow_unsandboxed=allow_unsandboxed, launch_count=launch_count, hide=hide,
                    scratch_parent=scratch_parent, namespaces=namespaces, triton_cache=triton_cache,
                    clock_control=clock_control, run_as=run_as)
    if isinstance(setup, dict):
        return setup
    try:
        attempts = metric_sets or [NCU_METRICS + [NCU_STALLS], NCU_METRICS]
        wait_s = timeout - (time.monotonic() - started) if lock_wait_s is None else lock_wait_s
        if on_ready is not None:
            # Under the server (the READY/go handshake), only the profiled part takes the host's
            # ncu lock, with the server's device slot: ncu's start-up, the interpreter and torch's
            # import, most of a session's seconds, overlap with other jobs' sessions, which sit
            # at READY before any of their candidate's code runs.
            try:
                return _ncu_attempts(setup, attempts, timeout, started, on_spawn, kernel_names, top,
                                     with_the_lock(on_ready, wait_s, lock_key))
            except NcuBusy as exc:
                return unavailable(exc, wait_s)
        try:
            with ncu_lock(wait_s, lock_key) as held:
                if not held:
                    return busy_report(wait_s)
                started = time.monotonic()  # the wait for another session is not this run's time
                return _ncu_attempts(setup, attempts, timeout, started, on_spawn, kernel_names, top, on_ready)
        except NcuLockRefused as exc:
            return unavailable(exc, wait_s)
    finally:
        setup.remove()


class Setup:
    """A session's scratch, jail, environment and command line (prepare), before any ncu runs."""

    def __init__(self, ncu: str, outer: Path, scratch: Path, env: dict[str, str], base: list[str], app: list[str]):
        self.ncu, self.outer, self.scratch, self.env, self.base, self.app = ncu, outer, scratch, env, base, app
        self.report = scratch / "report"

    def argv(self, metrics: list[str]) -> list[str]:
        return self.base + ["--metrics", ",".join(metrics)] + self.app

    def stage_triton_cache(self, triton_cache: Path | None, run_as: tuple[int, int] | None = None) -> None:
        """The candidate's own Triton cache from its evaluation, copied into the scratch so that its
        kernels are not compiled again under ncu (its own files: it can only mislead itself with
        them); owned by `run_as` where the session runs as that uid (copied after its jail began)."""
        if triton_cache is not None and Path(triton_cache).is_dir():
            shutil.copytree(triton_cache, self.scratch / ".triton", symlinks=False, dirs_exist_ok=True)
            if run_as is not None and os.geteuid() == 0:
                for path in [self.scratch / ".triton", *(self.scratch / ".triton").rglob("*")]:
                    with contextlib.suppress(OSError):
                        os.lchown(path, int(run_as[0]), int(run_as[1]))

    def stage_build_cache(self, cache_dir: str | Path | None, candidate_sha: str,
                          run_as: tuple[int, int] | None = None) -> None:
        """A verified copy of this candidate's cached CUDA builds, never the cache itself."""
        if cache_dir:
            from kernelagent.harness.server import build_cache

            target = self.scratch / ".ka-build-cache"
            build_cache.stage(cache_dir, candidate_sha, target)
            if run_as is not None and os.geteuid() == 0 and target.exists():
                for path in [target, *target.rglob("*")]:
                    with contextlib.suppress(OSError):
                        os.lchown(path, int(run_as[0]), int(run_as[1]))

    def remove(self) -> None:
        shutil.rmtree(self.outer, ignore_errors=True)


def session_visible_devices(device: str, environ: Mapping[str, str] | None = None) -> str | None:
    """CUDA_VISIBLE_DEVICES for a session on `device`: N for `cuda:N` (the caller's physical
    index); for `cuda` (a server's session, on the server's device) the server's first visible GPU
    only, as its jobs' processes (devices.first_visible_device); None: left as it is."""
    if device.startswith("cuda:"):
        return device.split(":", 1)[1]
    return first_visible_device(environ) if device == "cuda" else None


def prepare(problem_path: str | Path, candidate_source: str, *, backend: str, device: str,
            kernel_names: list[str] | None, calls: int, cache_dir: str | Path | None, candidate_sha: str,
            allow_unsandboxed: bool, launch_count: int | None, hide: list[Path] | None,
            scratch_parent: Path | None, namespaces: bool | None, triton_cache: Path | None,
            clock_control: str, run_as: tuple[int, int] | None) -> "Setup | dict[str, Any]":
    """The scratch (alone in a directory of its own, which the jail hides), the jail, the
    environment and ncu's command line for one session (see run_ncu), or {"unavailable": why}."""
    ncu = find_ncu()
    if ncu is None:
        return {"unavailable": "ncu (Nsight Compute) was not found (PATH, /usr/local/cuda/bin, $KERNELAGENT_NCU)"}
    from kernelagent.harness.jail import sandbox

    outer = Path(tempfile.mkdtemp(prefix="kernelagent-ncu-", dir=scratch_parent))
    scratch = outer / "job"
    scratch.mkdir()
    try:
        jail, why = ncu_sandbox(scratch, allow_unsandboxed, hide, namespaces, run_as)
        if jail is None:
            shutil.rmtree(outer, ignore_errors=True)
            return {"unavailable": why}
        (scratch / "candidate.py").write_text(candidate_source)
        env = sandbox.scrubbed_environ()
        env.update(HOME=str(scratch), TMPDIR=str(scratch), TRITON_CACHE_DIR=str(scratch / ".triton"),
                   TORCH_EXTENSIONS_DIR=str(scratch / ".torch_extensions"), KERNELAGENT_CANDIDATE_SHA=candidate_sha,
                   PYTHONUNBUFFERED="1")
        visible = session_visible_devices(device)
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        env.pop("TRITON_INTERPRET", None)
        package_root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        # Inside the sandbox the problem file must be readable: a copy sits in the scratch.
        shutil.copyfile(problem_path, scratch / "problem.py")
        app = interpreter.module_argv("kernelagent.harness.child.ncu_entry", str(scratch / "problem.py"),
                                      str(scratch / "candidate.py"), backend, str(calls))
        names = [re.escape(n) for n in (kernel_names or []) if n][:4]
        base = jail + [ncu, "--profile-from-start", "off", "--target-processes", "all", "--clock-control",
                       clock_control, "-f", "-o", str(scratch / "report")]
        if names:
            base += ["--kernel-name", "regex:" + "|".join(names)]
        base += ["--launch-count", str(launch_count or max(1, calls) * 8)]
        setup = Setup(ncu, outer, scratch, env, base, app)
        setup.stage_triton_cache(triton_cache)
        if backend == "cuda":
            setup.stage_build_cache(cache_dir, candidate_sha)
        return setup
    except BaseException:
        shutil.rmtree(outer, ignore_errors=True)
        raise


def _ncu_attempts(setup: Setup, attempts: list[list[str]], timeout: float, started: float,
                  on_spawn: Callable[[int | None], None] | None, kernel_names: list[str] | None,
                  top: int, on_ready: Callable[[], Any] | None = None) -> dict[str, Any]:
    """run_ncu's runs: each metric list in turn until one is accepted."""
    last = ""
    for metrics in attempts:
        remaining = timeout - (time.monotonic() - started)
        if remaining < 5:
            return {"unavailable": f"ncu ran past its {timeout:.0f} s budget"}
        (setup.scratch / GO_FILE).unlink(missing_ok=True)
        proc = run_session(setup.argv(metrics), setup.scratch, setup.env, remaining, on_spawn, on_ready)
        result = read_session(setup, proc, timeout, kernel_names, top, started)
        if result.get("retry") and metrics is not attempts[-1]:
            last = result.get("last", "")
            continue  # an unknown metric name on this ncu: retry without the stall metrics
        result.pop("retry", None)
        result.pop("last", None)
        if "kernels" in result:
            result["stalls_collected"] = metrics is attempts[0]
        return result
    return {"unavailable": "the ncu run failed: " + last[-600:]}


def _violations_line(line: str) -> Any:
    """The violations the session's line reports. The line comes from the process that runs the
    candidate's code again: bounded JSON (bounded_json.py), else the candidate's tampering (a
    200,000-deep array there was a RecursionError while reading the evidence)."""
    try:
        return bounded_json.loads(line.split(" ", 1)[-1].encode("utf-8", "replace"))
    except bounded_json.Refused as exc:
        return {"tampering": [f"the report line of its run under Nsight Compute is not ours: {exc}"]}


def read_session(setup: Setup, proc: subprocess.CompletedProcess | None, timeout: float,
                 kernel_names: list[str] | None, top: int, started: float) -> dict[str, Any]:
    """What one finished session says: {"kernels", "seconds", "phases"} from ncu's report (its host
    process wrote it), or {"unavailable": why} (with "retry" where a metric name was refused)."""
    if proc is None:
        return {"unavailable": f"ncu ran past its {timeout:.0f} s limit (or its part under ncu held the device "
                               f"past {PROFILED_HOLD_S:.0f} s) and was stopped"}
    last = (proc.stdout + proc.stderr)[-3000:]
    if "ERR_NVGPUCTRPERM" in last:
        return {"unavailable": "ncu has no permission to read the GPU's performance counters "
                               "(ERR_NVGPUCTRPERM: needs NVreg_RestrictProfilingToAdminUsers=0 or root)"}
    if "KERNELAGENT_NCU_DONE" not in proc.stdout + proc.stderr:
        tail = [x for x in last.splitlines() if x.strip()][-4:]
        if any("metric" in x.lower() for x in tail):
            return {"unavailable": "the ncu run failed: " + " | ".join(tail)[-600:], "retry": True, "last": last}
        return {"unavailable": "the ncu run failed: " + " | ".join(tail)[-600:]}
    done = [x for x in (proc.stdout + proc.stderr).splitlines() if x.startswith("KERNELAGENT_NCU_DONE")]
    violations = _violations_line(done[-1]) if done else {}
    if violations:
        # Also as data: the caller rejects on them as the main run would have (a candidate
        # that switched the monitor off there can still be seen here).
        return {"unavailable": f"the candidate did something not allowed under ncu: {violations}",
                "violations": violations}
    rep = setup.report.with_suffix(".ncu-rep")
    if not rep.exists():
        return {"unavailable": "ncu profiled no kernel (kernel-name filter: "
                               f"{', '.join(kernel_names or []) or 'none'})"}
    importing = time.monotonic()
    # The launches by their demangled and by their mangled names, read side by side: ncu's
    # demangled form can drop the lambdas that name a library kernel's purpose (a copy's
    # `direct_copy_kernel_cuda`), and glue is recognised by name (cuda_source.is_glue_kernel).
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        reads = [pool.submit(run_counted, [setup.ncu, "--import", str(rep), "--csv", "--page", "raw",
                                                   "--print-units", "base"] + extra, 60)
                 for extra in ([], ["--print-kernel-base", "mangled"])]
        (imported, cpu_a), (mangled, cpu_b) = (f.result() for f in reads)
    records = parse_ncu_csv(imported.stdout)
    by_id = {r.get("ID"): r.get("Kernel Name") for r in parse_ncu_csv(mangled.stdout)}
    for rec in records:
        rec["Mangled Name"] = by_id.get(rec.get("ID")) or ""
    kernels = summarise_ncu(records, top=top)
    if not kernels:
        return {"unavailable": "ncu returned no metrics: " + imported.stderr[-300:]}
    phases = dict(getattr(proc, "phases", {}), import_s=round(time.monotonic() - importing, 3))
    phases["cpu_s"] = round(float(phases.get("cpu_s", 0.0)) + cpu_a + cpu_b, 3)  # the session's and the reads
    return {"kernels": kernels, "seconds": time.monotonic() - started, "phases": phases}


