"""Why a kernel is slow, in a few lines a model can act on: `kernelagent profile` and the
agent's `profile` tool.

Three sources, each optional:
1. torch.profiler (the harness's `EvalConfig(profile=True)` run, in the candidate's own
   sandboxed process): the kernels launched, with time, launches per call and share of the
   device time, and which of them are the candidate's own.
2. A roofline from the problem's workload (input + output + parameter bytes, and FLOPs from
   `get_flops()` when the problem has it) against the device's peaks (kernelagent/hardware.py):
   achieved bandwidth and FLOP/s as fractions of peak, and which roof binds.
3. Nsight Compute, where `ncu` exists and there is a GPU: a separate small process imports the
   candidate (with the same audit hook as in the harness, and only once the harness has found
   the candidate correct and not flagged), runs a few forward calls between
   cudaProfilerStart/Stop, and ncu collects a handful of metrics for the top kernels only
   (`--kernel-name`, `--launch-count`, time-boxed): DRAM and SM throughput as % of peak,
   achieved and theoretical occupancy, the occupancy limiter, registers per thread, shared
   memory per block, and the top warp stall reasons.

Without a GPU or without ncu, the report says what it could not measure and why.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from kernelagent import hardware
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
    for path in (os.environ.get("KERNELAGENT_NCU"), shutil.which("ncu"), "/usr/local/cuda/bin/ncu"):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


# --------------------------------------------------------------------------------------
# Roofline from an EvalResult
# --------------------------------------------------------------------------------------

def roofline(result: Any, fingerprint: dict[str, Any] | None = None) -> dict[str, Any]:
    """Roofline fractions for the candidate's median time, or {"unavailable": why}."""
    fingerprint = fingerprint if fingerprint is not None else result.fingerprint
    device = hardware.describe_device(fingerprint or {})
    timing = result.timings.get("candidate")
    work = result.workload or {}
    if device.get("kind") != "cuda":
        return {"unavailable": "no GPU: achieved bandwidth and FLOP/s cannot be measured on the CPU "
                               "(interpreter timings are not meaningful)"}
    if timing is None or not timing.meaningful:
        return {"unavailable": "the candidate was not timed"}
    if not work.get("output_bytes") and not work.get("input_bytes"):
        return {"unavailable": "the problem's workload (bytes) is unknown"}
    nbytes = float((work.get("input_bytes") or 0) + (work.get("output_bytes") or 0) + (work.get("param_bytes") or 0))
    out = hardware.roofline_fractions(device, nbytes, work.get("flops"), str(work.get("dtype") or "float32"),
                                      timing.median_ms)
    out["device"] = device.get("name")
    if out.get("peak_gbs") is None:
        out["note"] = f"no datasheet peaks for {device.get('name')}: fractions unknown"
    return out


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
    for row in rows[1:]:
        if len(row) != len(header):
            continue
        record = dict(zip(header, row))
        if not record.get("ID", "").strip().isdigit():
            continue  # the units row
        out.append(record)
    return out


def _num(value: Any) -> float | None:
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
                namespaces: bool | None = None) -> tuple[list[str] | None, str | None]:
    """(the prefix ncu runs under, None) or (None, why ncu must not run).

    ncu starts the candidate's code itself, outside the harness server's per-job jail, so it
    gets a jail of its own: bubblewrap where it is installed (a read-only root, the home hidden,
    only its scratch writable, its own pid/net/ipc namespaces, no capabilities), else the
    per-job jail itself entered by child/jail_exec.py (the same kernel namespaces every job
    gets, plus a private /tmp and a loopback for ncu). Without either it runs only when the user
    asked for it explicitly (`--ncu`): the candidate could otherwise read the caller's
    environment and files. namespaces: True where the caller knows the per-job jail works (the
    harness server, whose jobs use it, and which may itself run inside bubblewrap): it is then
    used first; None: probe."""
    from kernelagent.harness.caller import sandbox

    if not namespaces:
        prefix = sandbox.bubblewrap_command(scratch)
        if prefix is not None:
            return prefix, None
    if namespaces or namespaces_work():
        home = Path(os.path.expanduser("~")).resolve()
        hidden = [Path(p) for p in (hide or [])] + [scratch.parent]
        if str(home) not in ("/", "") and home.is_dir():
            hidden.append(home)
        argv = [sys.executable, "-m", "kernelagent.harness.child.jail_exec", "--scratch", str(scratch)]
        for path in dict.fromkeys(p.resolve() for p in hidden):
            # Directories only (the jail hides directories), never the scratch or the root itself.
            if path.is_dir() and path not in (scratch.resolve(), Path("/")) and scratch.resolve() not in path.parents:
                argv += ["--hide", str(path)]
        return argv + ["--"], None
    if allow_unsandboxed:
        return [], None
    return None, UNSANDBOXED_NCU


_NAMESPACES: dict[str, bool] = {}


def namespaces_work() -> bool:
    """Does the per-job jail work in this process's world (probed once, in forked children)?"""
    if os.environ.get("KERNELAGENT_NCU_NO_NAMESPACES"):  # tests: the machine without them
        return False
    if "work" not in _NAMESPACES:
        from kernelagent.harness.child import jail_probe

        try:
            _NAMESPACES["work"] = bool(jail_probe.probe().get("namespaces_work"))
        except Exception:  # noqa: BLE001 - a probe that breaks means they do not work here
            _NAMESPACES["work"] = False
    return _NAMESPACES["work"]


# The longest the candidate's part of an ncu session (import, warm-up, profiled calls) may hold
# the device's timing slot: neighbours' timed loops wait meanwhile (their clocks paused).
PROFILED_HOLD_S = 60.0


def _kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.kill()


def _run_session(argv: list[str], cwd: Path, env: dict[str, str], timeout: float,
                 on_spawn: Callable[[int | None], None] | None,
                 on_ready: Callable[[], Any] | None = None) -> subprocess.CompletedProcess | None:
    """subprocess.run in a session of its own (so one signal reaches ncu, the jail and the
    candidate's processes), with `on_spawn` told its pid; None when it ran past `timeout` (then
    the whole session is killed). on_ready: a context manager factory (the server's timing slot)
    entered when the target says READY (child/ncu_entry.py: before the candidate's code runs),
    before it is let go, and left when it has finished its profiled calls (or after
    PROFILED_HOLD_S, when the session is killed)."""
    if on_ready is not None:
        env = dict(env, KERNELAGENT_NCU_HANDSHAKE="1")
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    if on_spawn is not None:
        on_spawn(proc.pid)
    lines: list[str] = []
    ready, finished = threading.Event(), threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if len(lines) < 20_000:
                lines.append(line)
            if line.startswith("KERNELAGENT_NCU_READY"):
                ready.set()
            elif line.startswith("KERNELAGENT_NCU_DONE"):
                finished.set()
        ready.set()
        finished.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    overheld = False
    deadline = time.monotonic() + timeout
    try:
        if on_ready is not None and ready.wait(max(0.0, deadline - time.monotonic())) and proc.poll() is None:
            with on_ready():
                (cwd / GO_FILE).touch()
                if not finished.wait(min(PROFILED_HOLD_S, max(0.0, deadline - time.monotonic()))):
                    _kill_session(proc)  # it holds the device too long: no evidence, no win
                    overheld = True
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_session(proc)
        proc.wait()
        return None
    except BaseException:  # the slot could not be had (the server's bug, an interrupt): nothing outlives it
        _kill_session(proc)
        proc.wait()
        raise
    finally:
        if on_spawn is not None:
            on_spawn(None)
        reader.join(5)
    out = "".join(lines)
    if overheld:
        return None
    return subprocess.CompletedProcess(argv, proc.returncode, out, "")


def run_ncu(problem_path: str | Path, candidate_source: str, backend: str = "triton", device: str = "cuda:0",
            kernel_names: list[str] | None = None, calls: int = 2, timeout: float = 180.0,
            cache_dir: str | Path | None = None, candidate_sha: str = "",
            allow_unsandboxed: bool = False, metric_sets: list[list[str]] | None = None,
            top: int = 3, launch_count: int | None = None, hide: list[Path] | None = None,
            on_spawn: Callable[[int | None], None] | None = None,
            scratch_parent: Path | None = None, namespaces: bool | None = None,
            triton_cache: Path | None = None, clock_control: str = "base",
            on_ready: Callable[[], Any] | None = None) -> dict[str, Any]:
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
    share it, as the kernel evidence does); on_ready: see _run_session.

    One ncu session at a time on this host (`ncu_lock`): Nsight Compute serialises its sessions
    through a lock file in /tmp, which a jailed session's private /tmp no longer shares, and two
    sessions profiling at once hang each other."""
    ncu = find_ncu()
    if ncu is None:
        return {"unavailable": "ncu (Nsight Compute) was not found (PATH, /usr/local/cuda/bin, $KERNELAGENT_NCU)"}
    from kernelagent.harness.caller import sandbox

    # The scratch sits alone in a directory of its own, which the jail hides (anything beside it
    # in the temp directory stays out of sight).
    outer = Path(tempfile.mkdtemp(prefix="kernelagent-ncu-", dir=scratch_parent))
    scratch = outer / "job"
    scratch.mkdir()
    started = time.monotonic()
    try:
        jail, why = ncu_sandbox(scratch, allow_unsandboxed, hide, namespaces)
        if jail is None:
            return {"unavailable": why}
        (scratch / "candidate.py").write_text(candidate_source)
        if triton_cache is not None and Path(triton_cache).is_dir():
            shutil.copytree(triton_cache, scratch / ".triton", symlinks=False, dirs_exist_ok=True)
        report = scratch / "report"
        env = sandbox.scrubbed_environ()
        env.update(HOME=str(scratch), TMPDIR=str(scratch), TRITON_CACHE_DIR=str(scratch / ".triton"),
                   TORCH_EXTENSIONS_DIR=str(scratch / ".torch_extensions"), KERNELAGENT_CANDIDATE_SHA=candidate_sha,
                   PYTHONUNBUFFERED="1")
        if backend == "cuda" and cache_dir:
            # A verified copy of this candidate's cached builds, never the cache itself.
            from kernelagent.harness.server import build_cache

            build_cache.stage(cache_dir, candidate_sha, scratch / ".ka-build-cache")
        if device.startswith("cuda:"):
            env["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]
        env.pop("TRITON_INTERPRET", None)
        package_root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        app = [sys.executable, "-m", "kernelagent.harness.child.ncu_entry", str(Path(problem_path).resolve()),
               str(scratch / "candidate.py"), backend, str(calls)]
        names = [re.escape(n) for n in (kernel_names or []) if n][:4]
        # Inside the sandbox the problem file must be readable: a copy sits in the scratch.
        shutil.copyfile(problem_path, scratch / "problem.py")
        app[3] = str(scratch / "problem.py")
        base = jail + [ncu, "--profile-from-start", "off", "--target-processes", "all", "--clock-control",
                       clock_control, "-f", "-o", str(report)]
        if names:
            base += ["--kernel-name", "regex:" + "|".join(names)]
        base += ["--launch-count", str(launch_count or max(1, calls) * 8)]
        attempts = metric_sets or [NCU_METRICS + [NCU_STALLS], NCU_METRICS]
        with ncu_lock(timeout - (time.monotonic() - started)) as held:
            if not held:
                return {"unavailable": f"another Nsight Compute session held this host's profiler for all of the "
                                       f"{timeout:.0f} s budget"}
            started = time.monotonic()  # the wait for another session is not this run's time
            return _ncu_attempts(ncu, base, app, attempts, scratch, env, report, timeout, started, on_spawn,
                                 kernel_names, top, on_ready)
    finally:
        shutil.rmtree(outer, ignore_errors=True)


def _ncu_attempts(ncu: str, base: list[str], app: list[str], attempts: list[list[str]], scratch: Path,
                  env: dict[str, str], report: Path, timeout: float, started: float,
                  on_spawn: Callable[[int | None], None] | None, kernel_names: list[str] | None,
                  top: int, on_ready: Callable[[], Any] | None = None) -> dict[str, Any]:
    """run_ncu's runs: each metric list in turn until one is accepted."""
    last = ""
    for metrics in attempts:
        remaining = timeout - (time.monotonic() - started)
        if remaining < 5:
            return {"unavailable": f"ncu ran past its {timeout:.0f} s budget"}
        (scratch / GO_FILE).unlink(missing_ok=True)
        proc = _run_session(base + ["--metrics", ",".join(metrics)] + app, scratch, env, remaining, on_spawn,
                            on_ready)
        if proc is None:
            return {"unavailable": f"ncu ran past its {timeout:.0f} s limit (or its part under ncu held the device "
                                   f"past {PROFILED_HOLD_S:.0f} s) and was stopped"}
        last = (proc.stdout + proc.stderr)[-3000:]
        if "ERR_NVGPUCTRPERM" in last:
            return {"unavailable": "ncu has no permission to read the GPU's performance counters "
                                   "(ERR_NVGPUCTRPERM: needs NVreg_RestrictProfilingToAdminUsers=0 or root)"}
        if "KERNELAGENT_NCU_DONE" not in proc.stdout + proc.stderr:
            tail = [x for x in last.splitlines() if x.strip()][-4:]
            if any("metric" in x.lower() for x in tail) and metrics is not attempts[-1]:
                continue  # an unknown metric name on this ncu: retry without the stall metrics
            return {"unavailable": "the ncu run failed: " + " | ".join(tail)[-600:]}
        done = [x for x in (proc.stdout + proc.stderr).splitlines() if x.startswith("KERNELAGENT_NCU_DONE")]
        violations = json.loads(done[-1].split(" ", 1)[1]) if done else {}
        if violations:
            return {"unavailable": f"the candidate did something not allowed under ncu: {violations}"}
        rep = report.with_suffix(".ncu-rep")
        if not rep.exists():
            return {"unavailable": "ncu profiled no kernel (kernel-name filter: "
                                   f"{', '.join(kernel_names or []) or 'none'})"}
        imported = subprocess.run([ncu, "--import", str(rep), "--csv", "--page", "raw"], capture_output=True,
                                  text=True, timeout=60)
        kernels = summarise_ncu(parse_ncu_csv(imported.stdout), top=top)
        if not kernels:
            return {"unavailable": "ncu returned no metrics: " + imported.stderr[-300:]}
        return {"kernels": kernels, "seconds": time.monotonic() - started,
                "stalls_collected": metrics is attempts[0]}
    return {"unavailable": "the ncu run failed: " + last[-600:]}


@contextlib.contextmanager
def ncu_lock(wait_s: float) -> Iterator[bool]:
    """This host's one Nsight Compute session (an flock on a file in the temp directory, outside
    every jail); yields False when it could not be had within `wait_s`."""
    import fcntl

    path = Path(tempfile.gettempdir()) / f"kernelagent-ncu-{os.getuid()}.lock"
    fd = os.open(str(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        until = time.monotonic() + max(0.0, wait_s)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= until:
                    yield False
                    return
                time.sleep(0.1)
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------
# The few lines
# --------------------------------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:.0f}%"


def _stall_words(reason: str) -> str:
    return {"long_scoreboard": "long scoreboard (waiting on global/local memory)",
            "short_scoreboard": "short scoreboard (shared memory / MUFU)",
            "mio_throttle": "MIO throttle (shared-memory instruction queue)",
            "lg_throttle": "LG throttle (too many global memory instructions)",
            "barrier": "barrier (__syncthreads)", "math_pipe_throttle": "math pipe throttle",
            "wait": "fixed-latency wait", "not_selected": "not selected (enough eligible warps)",
            "membar": "memory barrier", "tex_throttle": "texture throttle", "dispatch_stall": "dispatch stall",
            "no_instruction": "no instruction (instruction cache)", "branch_resolving": "branch resolving",
            "drain": "drain (stores at exit)", "imc_miss": "constant cache miss",
            "sleeping": "sleeping", "selected": "selected (issuing)"}.get(reason, reason.replace("_", " "))


AGREEMENT_PCT = 3.0  # issue 13: the harness median and the profiler's kernel sum agree within 3% ...
AGREEMENT_MIN_MS = 0.05  # ... for kernels of 50 us or more


def clocks(result: Any) -> dict[str, Any]:
    """The two clocks of one evaluation, per forward call: the harness's median (the timed loop:
    L2 flushed before each call, synchronised, host time included) and the device time of every
    kernel the profiler saw, summed (torch.profiler in the candidate's process, 3 calls on the
    main inputs right after the timed loop; child/candidate_side.profile_kernels). Their
    difference is the host overhead per call (launches, Python, synchronisation), plus what the
    L2 flush costs the harness's calls (the profiled calls run without a flush).

    {"harness_ms", "profiler_ms", "host_overhead_ms", "diff_pct", "within_pct" (True/False, or
    None under 50 us where no target applies), "meaningful", "kernels", "note"}; {"unavailable":
    why} when either clock is missing."""
    timing = result.timings.get("candidate") if getattr(result, "timings", None) else None
    kernels = list(getattr(result, "kernels", None) or [])
    if timing is None:
        return {"unavailable": "the candidate was not timed"}
    if not kernels:
        return {"unavailable": "the profiler reported no kernels (ask for profiling: EvalConfig(profile=True))"}
    device = all(k.get("kind", "device") == "device" for k in kernels)
    # profile_kernels keeps the top 10 rows, each with its share of ALL the profiled time: the
    # total is any row's time over its share (exact for every row), so rows cut off still count.
    shared = [k for k in kernels if (k.get("share") or 0) > 0 and (k.get("total_ms") or 0) > 0]
    profiler_ms = (shared[0]["total_ms"] / shared[0]["share"]) if shared else \
        sum(float(k.get("total_ms") or 0.0) for k in kernels)
    harness_ms = float(timing.median_ms)
    meaningful = bool(timing.meaningful) and device
    out: dict[str, Any] = {
        "harness_ms": harness_ms, "harness_source": getattr(timing, "source", "in-process"),
        "profiler_ms": profiler_ms, "host_overhead_ms": harness_ms - profiler_ms,
        "diff_pct": 100.0 * (harness_ms - profiler_ms) / profiler_ms if profiler_ms > 0 else None,
        "kernels": len(kernels), "kind": "device" if device else "cpu", "meaningful": meaningful,
    }
    if meaningful and out["diff_pct"] is not None and profiler_ms >= AGREEMENT_MIN_MS:
        out["within_pct"] = abs(out["diff_pct"]) <= AGREEMENT_PCT
    else:
        out["within_pct"] = None
    if not meaningful:
        out["note"] = ("not meaningful: no GPU (the profiler's rows are CPU ops and the times are the Triton "
                       "interpreter's)" if not device else "not meaningful: the harness timing is not meaningful here")
    elif profiler_ms < AGREEMENT_MIN_MS:
        out["note"] = f"under {AGREEMENT_MIN_MS * 1e3:.0f} us of device time: no agreement target applies"
    return out


def clock_line(c: dict[str, Any]) -> str:
    """One line with both clocks and the host overhead apart."""
    if "unavailable" in c:
        return f"clocks: {c['unavailable']}"
    what = "device kernels" if c.get("kind") == "device" else "CPU ops"
    diff = "" if c.get("diff_pct") is None else f" ({c['diff_pct']:+.1f}% of the profiler's)"
    agree = {True: f"; within {AGREEMENT_PCT:g}%", False: f"; NOT within {AGREEMENT_PCT:g}%", None: ""}[
        c.get("within_pct")]
    return (f"clocks: harness {c['harness_ms']:.4f} ms/call median ({c.get('harness_source', 'in-process')}); "
            f"profiler {what} {c['profiler_ms']:.4f} ms/call; host overhead {c['host_overhead_ms']:.4f} ms/call"
            f"{diff}{agree}" + (f" [{c['note']}]" if c.get("note") else ""))


def summary_lines(result: Any, roof: dict[str, Any], ncu: dict[str, Any] | None) -> list[str]:
    """The report in a few lines a model can act on."""
    lines: list[str] = []
    timing = result.timings.get("candidate")
    cpu = not (result.fingerprint or {}).get("cuda")
    if timing is not None:
        base = [f"{n if n != 'compile' else 'TorchInductor'} {t.median_ms:.4f} ms" for n, t in result.timings.items()
                if n != "candidate"]
        speed = [f"{v:.2f}x vs {'TorchInductor' if n == 'compile' else n}" for n, v in result.speedups.items()]
        lines.append(f"time: candidate {timing.median_ms:.4f} ms median" + (f" ({', '.join(base)})" if base else "")
                     + (f"; {', '.join(speed)}" if speed else "")
                     + (" [CPU/interpreter: not meaningful]" if not timing.meaningful else ""))
    if result.kernels:
        what = "CPU ops (no GPU)" if cpu else "kernels"
        parts = [f"{k['name'][:70]} {_pct(k.get('share'))} ({k.get('calls', '?')}x/call"
                 + (", own" if k.get("own") else "") + ")" for k in result.kernels[:3]]
        lines.append(f"top {what}: " + "; ".join(parts))
        if not cpu and result.kernels and not result.kernels[0].get("own"):
            lines.append(f"note: the top kernel ({result.kernels[0]['name'][:60]}) is not one of your own kernels")
        if timing is not None:
            lines.append(clock_line(clocks(result)))
    if "unavailable" in roof:
        lines.append(f"roofline: {roof['unavailable']}")
    else:
        bw, comp = roof.get("bandwidth_fraction"), roof.get("compute_fraction")
        achieved = f"{roof['achieved_gbs']:.0f} GB/s"
        if roof.get("bound") == "compute" and comp is not None:
            lines.append(f"compute-bound at {_pct(comp)} of peak {roof['dtype']} FLOP/s "
                         f"({roof['achieved_tflops']:.1f} of {roof['peak_tflops']:.0f} TFLOP/s; memory {_pct(bw)} of "
                         f"peak bandwidth)")
        elif bw is not None:
            lines.append(f"memory-bound at {_pct(bw)} of peak DRAM bandwidth ({achieved} of "
                         f"{roof['peak_gbs']:.0f} GB/s, counting {roof['bytes'] / 1e6:.1f} MB per call)"
                         + (f"; compute {_pct(comp)} of peak" if comp is not None else ""))
        else:
            lines.append(f"roofline: achieved {achieved}; {roof.get('note', 'peaks unknown')}")
        if roof.get("roofline_fraction") is not None:
            lines.append(f"roofline: {_pct(roof['roofline_fraction'])} of the speed the roofline allows "
                         f"(floor {roof['floor_ms']:.4f} ms)")
    if ncu is None:
        pass
    elif "unavailable" in ncu:
        lines.append(f"ncu: not measured: {ncu['unavailable']}")
    else:
        for k in ncu.get("kernels", [])[:2]:
            parts = [f"DRAM {k['dram_pct']:.0f}% of peak" if k.get("dram_pct") is not None else None,
                     f"SM {k['sm_pct']:.0f}%" if k.get("sm_pct") is not None else None]
            occ = k.get("achieved_occupancy_pct")
            if occ is not None:
                theo = k.get("theoretical_occupancy_pct")
                parts.append(f"occupancy {occ:.0f}%" + (f" (theoretical {theo:.0f}%)" if theo is not None else ""))
            if k.get("registers_per_thread") is not None:
                parts.append(f"{k['registers_per_thread']:.0f} regs/thread")
            parts.append(f"{(k.get('smem_per_block') or 0) / 1024:.1f} KiB smem/block")
            if k.get("block_size"):
                parts.append(f"block {k['block_size']:.0f}, grid {k.get('grid_size') or 0:.0f}")
            lines.append(f"ncu {k['base_name'][:50]}: " + ", ".join(p for p in parts if p))
            limiter = k.get("occupancy_limiter")
            theo = k.get("theoretical_occupancy_pct")
            if limiter and theo is not None and theo < 99:
                detail = {"registers": f"registers ({k.get('registers_per_thread') or 0:.0f}/thread)",
                          "shared_mem": f"shared memory ({(k.get('smem_per_block') or 0) / 1024:.1f} KiB/block)",
                          "blocks": "the blocks-per-SM limit (blocks too small)",
                          "warps": "warps per SM (block size)"}[limiter]
                lines.append(f"  occupancy limited by {detail}")
            if k.get("top_stalls"):
                lines.append("  top stalls: " + ", ".join(f"{_stall_words(s['reason'])} {s['share']:.0%}"
                                                          for s in k["top_stalls"]))
    lines += advice(roof, ncu)
    return lines


def advice(roof: dict[str, Any], ncu: dict[str, Any] | None) -> list[str]:
    """One or two hints that follow from the numbers (never more)."""
    hints = []
    bw = roof.get("bandwidth_fraction")
    if roof.get("bound") == "memory" and bw is not None and bw < 0.6:
        hints.append("hint: memory-bound well below peak bandwidth: coalesce and vectorise loads/stores "
                     "(128-bit), avoid re-reading inputs, fuse passes, and launch enough blocks to fill every SM")
    comp = roof.get("compute_fraction")
    if roof.get("bound") == "compute" and comp is not None and comp < 0.5:
        hints.append("hint: compute-bound well below peak: use tensor cores (tl.dot / mma) where the dtype allows, "
                     "tile for data reuse in shared memory/registers")
    if ncu and ncu.get("kernels"):
        k = ncu["kernels"][0]
        stalls = [s["reason"] for s in k.get("top_stalls", [])]
        if stalls and stalls[0] == "long_scoreboard" and (k.get("achieved_occupancy_pct") or 100) < 50:
            hints.append("hint: warps wait on memory with low occupancy: raise occupancy (fewer registers, smaller "
                         "shared-memory tiles) or add memory-level parallelism per thread")
        elif stalls and stalls[0] == "barrier":
            hints.append("hint: warps wait at barriers: use warp-level reductions (shuffles) instead of "
                         "__syncthreads-heavy block reductions")
    return hints[:2]


def profile(problem: Any, candidate_source: str, *, evaluator: Any = None, device: str = "auto",
            backend: str = "triton", trials: int = 2, use_ncu: bool | str = "auto", ncu_timeout: float = 180.0,
            baselines: bool = True, config_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Evaluate with profiling, then the roofline and (where possible) ncu. Returns
    {"result": EvalResult, "roofline": {...}, "ncu": {...} | None, "lines": [...]}."""
    from contextlib import ExitStack

    from kernelagent.harness import EvalConfig, Evaluator, Status
    from kernelagent.problem import load_problem

    if not hasattr(problem, "source"):
        problem = load_problem(problem)
    with ExitStack() as stack:
        if evaluator is None:
            evaluator = stack.enter_context(Evaluator(device=device))
        config = EvalConfig(**{**(config_overrides or {}), "trials": trials, "timing": True, "baselines": baselines,
                               "profile": True, "backend": backend})
        result = evaluator.evaluate(problem, candidate_source, config)
        fingerprint = result.fingerprint or evaluator.fingerprint()
        roof = roofline(result, fingerprint)
        ncu: dict[str, Any] | None
        if use_ncu is False:
            ncu = None
        elif not fingerprint.get("cuda"):
            ncu = {"unavailable": "no GPU: Nsight Compute metrics (DRAM/SM throughput, occupancy, registers, "
                                  "shared memory, stalls) need one"}
        elif result.status != Status.CORRECT or not result.passed:
            ncu = {"unavailable": f"skipped: the candidate is {result.status}"
                                  + ("" if result.status != Status.CORRECT else " but flagged")
                                  + " (ncu runs only correct, unflagged candidates)"}
        else:
            names = [k["name"] for k in result.kernels if k.get("own")][:3] or [k["name"] for k in result.kernels[:2]]
            from kernelagent.harness.cuda_source import kernel_base_name

            dev = getattr(evaluator, "visible_devices", None)
            ncu = run_ncu(problem.path, candidate_source, backend=backend, allow_unsandboxed=use_ncu is True,
                          device=f"cuda:{dev}" if dev is not None else "cuda:0",
                          kernel_names=sorted({kernel_base_name(n) for n in names}), timeout=ncu_timeout,
                          cache_dir=getattr(evaluator, "cuda_cache_dir", None), candidate_sha=result.candidate_sha256)
    lines = summary_lines(result, roof, ncu)
    return {"result": result, "roofline": roof, "ncu": ncu, "lines": lines, "clocks": clocks(result)}
