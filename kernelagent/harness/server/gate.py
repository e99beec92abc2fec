"""Several jobs at once on one device, with every timed loop alone on it.

The server runs up to `concurrency` jobs at a time (server/main.py), one thread each. Their host
work overlaps: fork, jail, import, compilation, input generation, transfers and comparison. What
must not overlap is anything timed: the calibration loop, the candidate's timed loop and the
baselines. A job takes the `Gate` for those, and while it holds it:

1. every other job's processes are stopped (SIGSTOP: the candidate's process group and pid
   namespace, and the reference process), so none of them can put a new kernel on the device,
   however hostile: a candidate whose threads launch kernels from import on is stopped with the
   rest;
2. work they queued before they were stopped still runs, so (with the holder's own candidate
   stopped as well) the holder's trusted reference process then probes the device (`idle_probe`: a tiny spin, launched and synchronised; another
   context's kernels time-slice with it and stretch it from ~60 us to milliseconds) until it
   reads idle, before the calibration and again before the candidate's loop;
3. the stopped jobs' stage clocks are paused for as long as the holder is timing (`Job.clock`),
   so a job is never timed out for the time a neighbour held the device. The drain of their own
   queued work in step 2 is not credited: a neighbour that queued minutes of kernels runs into
   its own stage limit and is killed, which is what ends its queue. The wait is bounded
   (`idle_wait_s`); past it the holder's times carry the review flag `device-busy`.
4. the empty loop's cost (the calibration) is measured once per problem and loop order in a
   server and reused by later jobs of that problem (`calibrations`), which halves a repeated
   problem's time in the slot; a claim that falls short of the server's clock still
   recalibrates, and the smaller measure counts.

Holding the gate is bounded by the holder's stage deadline (its loop is bounded there), and it is
released in a `finally`, so a hung job holds nothing past its limit.

`Admission` (server/admission.py) bounds how many jobs run at once (`concurrency`, chosen from the
host's CPUs and the device's memory by `default_concurrency`), and runs a job `alone` on request:
the caller re-runs alone a job that ran out of memory beside others, so a neighbour's memory is
never charged to a candidate.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from typing import Any, Callable, Iterator, Protocol

from kernelagent.harness.server.calibration_store import CalibrationStore
from kernelagent import settings
from kernelagent.harness.child import memory_plan

# A bandwidth reading within this factor of the recent best is quiet (Bandwidth); the wait for
# quiet bandwidth, on a device already idle of other kernels, lasts at most BANDWIDTH_WAIT_S.
BANDWIDTH_SLACK = 1.08
BANDWIDTH_WAIT_S = 1.0

# A job's processes, as the gate sees them.


class Freezable(Protocol):
    job_id: str

    def freeze(self, stop: bool) -> None: ...

    def freeze_candidate(self, stop: bool) -> None: ...

    def pause_clock(self, paused: bool) -> None: ...


class Gate:
    """The device's one timing slot. `hold(job, probe)` is a context manager: it waits for the
    slot (the waiter's clock paused: waiting is not its fault), stops every other registered job,
    and calls `probe()` until the device reads idle (see module docstring)."""

    def __init__(self, idle_wait_s: float = 30.0):
        self._lock = threading.Lock()  # guards the registry and the holder
        self._slot = threading.Lock()  # the timing slot itself
        self._jobs: dict[str, Freezable] = {}
        self._overlapped: set[str] = set()
        self._hold: "Hold | None" = None
        self.idle_wait_s = idle_wait_s
        # Intervals (job id, start, end) of every hold, for tests and the throughput benchmark.
        self.history: list[tuple[str, float, float]] = []
        # The empty loop's cost (the server's calibration), by problem and loop order: measured in
        # the trusted reference process with the device to itself, so a later job of the same
        # problem and order reuses it (a claim that falls short still recalibrates).
        self.calibrations: dict[str, float] = {}
        self.recalibrated: set[str] = set()  # calibrations measured twice (the smaller kept): not again
        # The same, shared by the servers of this host (server/calibration_store.py): read where this
        # server has none, written when it measures one. Serve() gives it its folder.
        self.calibration_store = CalibrationStore(None)
        # The timed loop's shape by problem and settings (timed.loop_plan), made by the first job
        # of a problem: later jobs run the same loop, so its calibration is reused (the loop's
        # length came from the reference's eager time per job, which differs by a few percent,
        # and so did the calibration's key, so every job calibrated again: docs/concepts/
        # concurrency.md, "Where an evaluation's time and the host's CPU go").
        self.plans: dict[str, dict[str, int]] = {}
        self.bandwidth = Bandwidth()
        # Called (no arguments) each time a job takes the slot: the admission's first wave opens
        # then (server/admission.py).
        self.hold_listeners: list[Callable[[], None]] = []
        from kernelagent.harness.server.profilers import Profilers

        # ncu sessions and in-process profiles kept apart (profilers.py); at most this many early
        # evidence sessions at once (KERNELAGENT_EARLY_EVIDENCE; 0: none, every session late)
        try:
            early = max(0, settings.get("KERNELAGENT_EARLY_EVIDENCE"))
        except ValueError:
            early = 3
        self.profilers = Profilers(max_early=early)
        self.memory: "MemoryLedger | None" = None  # set by the server on a GPU with several jobs at once
        # The memory plan's meta-device estimate, by problem (sha256 of its source): made once in a
        # throwaway fork, reused by every later job of the same problem.
        self.estimates: dict[str, dict[str, Any]] = {}

    # -- the registry -------------------------------------------------------------------
    def register(self, job: Freezable) -> None:
        with self._lock:
            self._jobs[job.job_id] = job
            if len(self._jobs) > 1:  # every job alive now shared the device with another
                self._overlapped.update(self._jobs)
            hold = self._hold
            if hold is not None and hold.job is not job:
                # Forked while another job times: stopped at once, before its candidate runs, and
                # let go with the others when that hold ends.
                job.freeze(True)
                hold.frozen.append(job)
                if hold.crediting:
                    job.pause_clock(True)

    def overlapped(self, job_id: str) -> bool:
        """Did this job ever share the device with another (while registered)?"""
        with self._lock:
            return job_id in self._overlapped

    def unregister(self, job: Freezable) -> bool:
        """Forget the job; whether it ever shared the device with another."""
        with self._lock:
            self._jobs.pop(job.job_id, None)
            shared = job.job_id in self._overlapped
            self._overlapped.discard(job.job_id)
            return shared

    def holder(self) -> "Freezable | None":
        """The job holding the timing slot now, if any."""
        with self._lock:
            return self._hold.job if self._hold is not None else None

    def active(self) -> int:
        with self._lock:
            return len(self._jobs)

    def evaluations(self) -> int:
        """The registered jobs that evaluate a candidate: a problem's baselines (a job with the
        reference's process only, `baselines_only`) are not counted."""
        with self._lock:
            return sum(1 for job in self._jobs.values() if not getattr(job, "baselines_only", False))

    # -- the slot -----------------------------------------------------------------------
    @contextmanager
    def hold(self, job: Freezable, probe: Callable[[], bool] | None = None,
             stats: dict[str, float] | None = None, freeze: bool = True) -> Iterator["Hold"]:
        """The slot for `job`: others stopped, the device idle (as far as `probe` can tell).
        `stats` gets wait_s (for the slot), idle_wait_s and held_s added to it. With
        `freeze=False` the slot is only taken (no other job times meanwhile, while their host
        work and checks go on) until `Hold.freeze()` stops them: the evidence's session warms up
        that way and is profiled frozen (server/evidence.py)."""
        stats = stats if stats is not None else {}
        waited = time.monotonic()
        self._take_slot(job)
        stats["wait_s"] = stats.get("wait_s", 0.0) + time.monotonic() - waited
        for listener in list(self.hold_listeners):
            listener()
        started, started_epoch = time.monotonic(), time.time()
        hold = Hold(self, job, probe, stats)
        try:
            if freeze:
                hold.freeze()
            yield hold
        finally:
            with self._lock:
                self._hold = None
                frozen, credited = list(hold.frozen), hold.crediting
            thawing = time.monotonic()
            for other in frozen:
                if credited:
                    other.pause_clock(False)
                try:
                    other.freeze(False)
                except Exception:  # noqa: BLE001
                    pass
            ended = time.monotonic()
            add_seconds(stats, "slot_thaw_s", ended - thawing)
            stats["held_s"] = stats.get("held_s", 0.0) + ended - started
            if hold.frozen_at is not None:
                stats["frozen_s"] = stats.get("frozen_s", 0.0) + ended - hold.frozen_at
            stats.setdefault("held", []).append([round(started_epoch, 4), round(time.time(), 4)])
            self.history.append((job.job_id, started, ended))
            del self.history[:-2000]
            self._slot.release()

    @contextmanager
    def between_holds(self, job: Freezable) -> Iterator[None]:
        """Around ending a job's processes: never while another job holds the slot. Memory a
        killed process held is cleared by the driver in the background, and that takes bandwidth
        from the kernels that run meanwhile (Bandwidth). The gate stops a neighbour's processes,
        not its job thread, which killed them (and so freed their memory) whenever its job ended,
        holder or not. Ended between holds, the clearing happens where the next holder's idle probe
        sees it and waits for quiet bandwidth. The wait pauses the ending job's clock."""
        self._take_slot(job)
        try:
            yield
        finally:
            self._slot.release()

    def _take_slot(self, job: Freezable) -> None:
        """Wait for the slot, the waiter's clock paused (waiting is not its fault)."""
        job.pause_clock(True)
        try:
            self._slot.acquire()
        finally:
            job.pause_clock(False)

    def _freeze_others(self, hold: "Hold") -> None:
        """Stop every other job, wait for the device to read idle, pause their clocks."""
        job, stats = hold.job, hold.stats
        started = time.monotonic()
        hold.frozen_at = started
        with self._lock:
            self._hold = hold
            for other in [j for j in self._jobs.values() if j is not job]:
                try:
                    other.freeze(True)
                    hold.frozen.append(other)
                except Exception:  # noqa: BLE001 - a job that just ended has nothing to stop
                    continue
        add_seconds(stats, "slot_freeze_s", time.monotonic() - started)
        # A neighbour whose candidate has not run a line yet (stage 'start') cannot be what
        # keeps the device busy: the drain is credited to it (a job stopped at its start by
        # one neighbour's drain after another's ran into its 60 s start limit on an H200).
        early = [o for o in hold.frozen if getattr(o, "stage", None) == "start"]
        for other in early:
            other.pause_clock(True)
        try:
            hold.wait_idle()
        finally:
            for other in early:
                other.pause_clock(False)
        # From here on the neighbours wait for us: their stage clocks stop.
        with self._lock:
            for other in hold.frozen:
                other.pause_clock(True)
            hold.crediting = True


class Hold:
    """The slot, held: `wait_idle()` again before each timed phase."""

    def __init__(self, gate: Gate, job: Freezable, probe: Callable[[], bool] | None, stats: dict[str, float]):
        self.gate, self.job, self.probe, self.stats = gate, job, probe, stats
        self.frozen: list[Freezable] = []
        self.crediting = False
        self.busy = False  # the device never read idle within the gate's wait
        self.frozen_at: float | None = None

    def freeze(self) -> None:
        """Stop every other job and wait for the device to read idle (once; `hold` does it
        unless asked not to)."""
        if self.frozen_at is None:
            self.gate._freeze_others(self)

    def wait_idle(self) -> bool:
        """Probe until the device reads idle, with the holder's own candidate stopped too (its
        backlog drains like the neighbours'); False (and `busy`) when it did not within the
        gate's idle_wait_s. The wait is not credited to anyone: a job whose queued kernels keep
        the device busy runs into its own stage limit.

        A probe answers a bool (no kernels of another context) or a pair (that, and whether the
        device's memory bandwidth reads quiet: see Bandwidth). Memory a process gives back to
        the driver is cleared by the driver in the background, and that takes bandwidth from
        whatever runs next: the wait goes on for quiet bandwidth too, but at most
        BANDWIDTH_WAIT_S, since a device that stays slower for good (its clocks) is no
        neighbour's work; that wait is recorded (`bandwidth_wait_s`, `bandwidth_busy`)."""
        if self.probe is None:
            return True
        started = time.monotonic()
        self.job.freeze_candidate(True)
        loud_since: float | None = None
        try:
            pause = 0.005
            while True:
                reading = self.probe()
                idle, quiet = reading if isinstance(reading, tuple) else (reading, True)
                if idle and not quiet:
                    now = time.monotonic()
                    loud_since = now if loud_since is None else loud_since
                    if now - loud_since >= BANDWIDTH_WAIT_S:
                        self.stats["bandwidth_busy"] = True
                        quiet = True
                if idle and quiet:
                    if loud_since is not None:
                        add_seconds(self.stats, "bandwidth_wait_s", time.monotonic() - loud_since)
                    return True
                if time.monotonic() - started > self.gate.idle_wait_s:
                    self.busy = True
                    return False
                time.sleep(pause)
                pause = min(pause * 2, 0.2)
        finally:
            self.job.freeze_candidate(False)
            self.stats["idle_wait_s"] = self.stats.get("idle_wait_s", 0.0) + time.monotonic() - started


class Bandwidth:
    """The device's memory bandwidth, as the trusted reference reads it in its idle probe: the
    median device time of a read-and-write pass over twice the L2 cache (`copy_us`). A reading is
    quiet within BANDWIDTH_SLACK of the least of the last WINDOW readings in this server (a
    window, so that clocks that drop for good become the new normal).

    Memory given back to the driver (`torch.cuda.empty_cache`, a process's exit) slows the
    kernels that run next, whichever process freed it, while the spin probe reads idle; this
    reading rises then and stays near its least when idle (docs/concepts/concurrency.md, "Memory
    bandwidth"; scripts/device/scrub_probe.py)."""

    WINDOW = 32

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reads: list[float] = []

    def quiet(self, copy_us: float | None) -> bool:
        if copy_us is None or not copy_us > 0:
            return True  # no reading (the CPU, or no memory for the pass): nothing to wait for
        with self._lock:
            self._reads = (self._reads + [float(copy_us)])[-self.WINDOW:]
            least = min(self._reads)
        return copy_us <= BANDWIDTH_SLACK * least


class MemoryLedger:
    """Device memory promised to admitted jobs: each reserves what the memory plan says it needs
    (job_memory_bytes: its processes' contexts, the problem's bytes in each and the harness's own)
    before its checks start,
    and waits (its clock paused) while the device cannot hold it beside the others. A need larger
    than the whole device is capped at it: that job then waits to run with nobody else."""

    def __init__(self, total_bytes: int | None):
        self.total = int(total_bytes) if total_bytes else None
        self._used = 0
        self._cond = threading.Condition()

    @property
    def used(self) -> int:
        """Bytes promised to admitted jobs now (our own bookkeeping, never a job's word)."""
        with self._cond:
            return self._used

    @contextmanager
    def reserve(self, job: Freezable, need: int) -> Iterator[None]:
        if self.total is None:
            yield
            return
        need = min(int(need), self.total)
        job.pause_clock(True)
        try:
            with self._cond:
                while self._used and self._used + need > self.total:
                    self._cond.wait()
                self._used += need
        finally:
            job.pause_clock(False)
        try:
            yield
        finally:
            with self._cond:
                self._used -= need
                self._cond.notify_all()


CONTEXT_BYTES = 600 << 20  # a CUDA context and the allocator's slack, per process


def job_memory_bytes(input_bytes: int, output_bytes: int, param_bytes: int, free_bytes: int | None = None,
                     contexts: int = 2) -> int:
    """The memory plan's reservation for one evaluation on a device (memory_plan.reserved_bytes),
    plus a CUDA context for each of its processes (two; three with an evidence session beside)."""
    sizes = {"input_bytes": input_bytes, "output_bytes": output_bytes, "param_bytes": param_bytes}
    return int(memory_plan.reserved_bytes(sizes, free_bytes) + contexts * CONTEXT_BYTES)


def default_concurrency(cpus: int | None = None, device_free_bytes: int | None = None,
                        cuda: bool = True) -> tuple[int, str]:
    """Jobs per device, and why: a job keeps about two host cores busy (its candidate compiles
    while its reference compares), and each of its two processes holds a CUDA context (about
    0.5 GiB) plus its share of the problem; at most 8. On the CPU, one job per two cores (the
    interpreter is the work there)."""
    cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
    by_cpu = max(1, cpus // 2)
    if not cuda:
        return min(by_cpu, 8), f"{cpus} CPUs / 2 per job"
    if device_free_bytes:
        by_memory = max(1, int(device_free_bytes // (4 << 30)))  # 4 GiB a job: contexts + a level-1 problem
        n = min(by_cpu, by_memory, 8)
        return n, f"min({cpus} CPUs / 2, {device_free_bytes / (1 << 30):.0f} GiB free / 4 GiB, 8)"
    return min(by_cpu, 8), f"{cpus} CPUs / 2 per job"


def process_tree(pid: int) -> set[int]:
    """`pid` and every descendant it has now (/proc's children lists, every thread's)."""
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.add(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    todo += [int(child) for child in handle.read().split()]
            except (OSError, ValueError):
                continue
    return found


def proc_stat(pid: int) -> tuple[str, str, int] | None:
    """(command name, state, start time) of a process from /proc/<pid>/stat; the start time
    (clock ticks since boot, field 22), with the pid, names one process, never a later one that
    reused the pid."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
        rest = text[text.rindex(")") + 2:].split()
        return text[text.index("(") + 1:text.rindex(")")], rest[0], int(rest[19])
    except (OSError, ValueError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    stat = proc_stat(pid)
    return stat[2] if stat else None


def signal_processes(pids: list[int], stop: bool) -> dict[int, int]:
    """Stop (continue) each process with its process group and every descendant: a reference
    process's Inductor compile workers and a build's ninja/nvcc (ninja puts its commands in
    process groups of their own) keep the host's cores busy otherwise, under a neighbour's
    timed loop. Walked twice, so a child started while the first signals landed is caught.
    Returns what was signalled, {pid: start time}, so that `continue_processes` can let go of
    exactly those later, whatever the tree looks like by then."""
    sig = signal.SIGSTOP if stop else signal.SIGCONT
    signalled: dict[int, int] = {}
    for pid in pids:
        try:
            os.killpg(pid, sig)
        except OSError:
            pass
        for _ in range(2 if stop else 1):
            for member in process_tree(pid):
                signalled.setdefault(member, start_time(member) or 0)
                try:
                    os.kill(member, sig)
                except OSError:
                    pass
    return signalled


def continue_processes(stopped: dict[int, int]) -> None:
    """SIGCONT every process of an earlier stop that is still the same process (pid and start
    time): one that left the tree meanwhile (its parent died, it was reparented) is not left
    stopped for ever, and a pid reused since is never signalled."""
    for pid, started in stopped.items():
        if started and start_time(pid) == started:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass


class Stops:
    """What the gate stopped of one process of a job (its tree, and whatever else the caller
    adds), {pid: start time}: a continue lets go of exactly those, whatever the tree has become,
    and a process already reaped is never signalled by its stale pid."""

    def __init__(self) -> None:
        self.pids: dict[int, int] = {}

    def signal(self, proc: BaseProcess | None, stop: bool, members: Callable[[], list[int]] | None = None) -> None:
        """Stop `proc` with its tree (signal_processes) and `members()` besides, recording each;
        continue exactly what the stops recorded (pid and start time), and the process group, which
        a stop's killpg reached beyond the tree. A continue walks no tree and reads no /proc listing:
        the timed loop stops and continues the candidate around every segment (hundreds a loop),
        and a walk or a scan of the pid namespace then could find only what the record holds (a
        stopped process starts no other) or what nobody stopped. A group member that left the tree
        before the stop (its parent exited) was stopped by the killpg alone and is let go by the
        group's. Where a stop could not read a process's start time (recorded as 0, and
        continue_processes never signals such a pid), the continue walks the tree and the members
        again, as a stop does."""
        unknown = False
        if not stop:
            unknown = any(not started for started in self.pids.values())
            continue_processes(self.pids)
            self.pids.clear()
        popen = getattr(proc, "_popen", None)
        if proc is None or proc.pid is None or (popen is not None and popen.returncode is not None):
            return  # reaped: its pid may belong to another process by now
        if not stop and not unknown:
            try:
                os.killpg(proc.pid, signal.SIGCONT)
            except OSError:
                pass
            return
        signalled = signal_processes([proc.pid], stop)
        for pid in members() if members is not None else []:
            try:
                os.kill(pid, signal.SIGSTOP if stop else signal.SIGCONT)
            except OSError:
                continue
            signalled.setdefault(pid, start_time(pid) or 0)
        if stop:
            self.pids.update(signalled)

    def still_stopped(self) -> list[str]:
        """'pid comm' of each process of an earlier stop that is still the same process and is
        still stopped (state T)."""
        found = []
        for pid, started in sorted(self.pids.items()):
            stat = proc_stat(pid)
            if stat is not None and stat[1] == "T" and stat[2] == started:
                found.append(f"{pid} {stat[0]}")
        return found


# Where a job's time holding the slot went (result.concurrency, each summed over its holds):
# freezing and thawing the other jobs, the idle probes, the calibration, the candidate's warm-up,
# its clocked segments, the comparisons of its kept outputs, the baselines' timing. What is left
# of held_s is the server's own bookkeeping between them.
SLOT_PARTS = ("slot_freeze_s", "idle_wait_s", "slot_calibration_s", "slot_warmup_s", "slot_loop_s",
              "slot_compare_s", "slot_baselines_s", "slot_thaw_s")


def add_seconds(stats: dict[str, Any], key: str, seconds: float) -> None:
    stats[key] = float(stats.get(key, 0.0)) + float(seconds)


def describe(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: round(float(v), 4) if isinstance(v, float) else v for k, v in stats.items()}
