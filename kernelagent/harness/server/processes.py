"""A job's processes from the server's side: how they are forked (the reference, the jailed
candidate, a short-lived one that derives CPU input sizes), killed and described."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from kernelagent import settings
from kernelagent.harness import protocol
from kernelagent.harness.server import forking
from kernelagent.harness.server.gate import proc_stat, process_tree
from kernelagent.text import clean_text

FORK = mp.get_context("fork")
LOG_TAIL_BYTES = 6000
# The candidate process's stack dumps while our code starts it, in wall seconds: well above an
# honest start's time on its stage clock beside other jobs and below the 'start' limit on that
# clock, so a start past its limit has dumped at least once (docs/concepts/concurrency.md,
# "Measurements behind the code").
START_STACK_S = 40.0


def forked_plan_cpu_inputs(source: str, workdir: Path, timeout: float) -> dict[str, Any]:
    """derive.plan_cpu_inputs in a short-lived forked process (it runs problem code: never in
    the server itself), bounded by `timeout`; {"error": ...} when it fails or runs out of time."""

    def plan() -> dict[str, Any]:
        from kernelagent.harness import derive

        return derive.plan_cpu_inputs(source, available_bytes=derive.available_memory())

    return _in_fork(plan, workdir, timeout, "deriving smoke sizes")


def forked_device_estimate(source: str, workdir: Path, timeout: float) -> dict[str, Any]:
    """The memory plan's meta-device estimate of one evaluation's sizes (child/memory_plan.py),
    in a short-lived forked process like forked_plan_cpu_inputs: {"error": ...} when the problem
    cannot be built on the meta device."""

    def estimate() -> dict[str, Any]:
        from kernelagent.harness.child import memory_plan

        return memory_plan.estimate(source) or {"error": "the problem cannot be built on the meta device"}

    return _in_fork(estimate, workdir, timeout, "estimating the problem's memory")


# In a forked helper's answer: the helper ran out of time or died, rather than answering (its
# "error" then says which); a caller may try again (server/memory.py).
HELPER_FAILED = "helper_failed"


def _in_fork(work: Callable[[], dict[str, Any]], workdir: Path, timeout: float, what: str) -> dict[str, Any]:
    parent_end, child_end = FORK.Pipe(duplex=False)

    def target() -> None:
        try:
            from kernelagent.harness import procname
            from kernelagent.harness.jail.fds import close_inherited_fds

            procname.set_name("ka-fork")

            close_inherited_fds([child_end.fileno(), 0, 1, 2])
            os.chdir(workdir)
            plan = work()
        except BaseException as exc:  # noqa: BLE001 - reported to the server
            plan = {"error": "".join(traceback.format_exception_only(type(exc), exc)).strip()[:1000]}
        child_end.send_bytes(json.dumps(protocol.json_safe(plan)).encode())
        os._exit(0)

    proc = FORK.Process(target=target, name="kernelagent-derive")
    forking.quiet_imports()  # no other thread mid-import as this helper is forked (server/forking.py)
    proc.start()
    child_end.close()
    try:
        if parent_end.poll(timeout):
            plan = json.loads(parent_end.recv_bytes(1 << 20))
            plan.pop(HELPER_FAILED, None)  # only this process says so
        else:
            plan = {"error": f"{what} took more than {timeout:.0f} s", HELPER_FAILED: True}
    except (EOFError, OSError, ValueError, AttributeError):  # AttributeError: not a JSON object
        plan = {"error": f"the process {what} died", HELPER_FAILED: True}
    finally:
        kill_group(proc)
        proc.join(5)
        parent_end.close()
    return plan


_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) of a process and every descendant alive now, each with what
    it has reaped of its own children (their `cutime`), read from /proc: taken just before a
    job's processes are killed, what they cost the host (Inductor's compile workers, a jail's
    init and the candidate under it included). 0.0 where there is nothing to read."""
    if not pid:
        return 0.0
    total, todo, seen = 0.0, [int(pid)], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            raw = open(f"/proc/{current}/stat", "rb").read().decode(errors="replace")
            fields = raw[raw.rfind(")") + 2:].split()
            total += sum(int(x) for x in fields[11:15]) / _TICK  # utime stime cutime cstime
        except (OSError, ValueError, IndexError):
            continue
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return total


def tree_states(pid: int | None, limit: int = 12) -> list[str]:
    """'pid comm state wchan ctxt=V/N cpus=LIST stack=...' for a process and its descendants (the
    process first, at most `limit`), read from /proc as a stage runs past its limit: what each was
    doing then. Without it a job beside others that used no CPU for its whole 'start' says only
    that it ran out of time; stopped (T), asleep in the kernel (S, and where) or running (R) tell
    a harness fault from a slow candidate. Names are cut to 16 printable characters."""
    if not pid:
        return []
    found: list[str] = []
    for current in [int(pid)] + sorted(process_tree(int(pid)) - {int(pid)}):
        stat = proc_stat(current)
        if stat is None:
            continue
        comm = "".join(c for c in stat[0] if c.isprintable())[:16].replace(" ", "_") or "?"
        try:
            wchan = open(f"/proc/{current}/wchan").read().strip()
            wchan = "".join(c for c in wchan if c.isalnum() or c == "_")[:40] or "-"
        except OSError:
            wchan = "?"
        found.append(f"{current} {comm} {stat[1][:1]} {wchan} {_switches(current)} {_kernel_stack(current)}".rstrip())
        if len(found) >= limit:
            break
    return found


def _switches(pid: int) -> str:
    """'ctxt=V/N cpus=LIST': the process's voluntary and involuntary context switches so far (a
    process in state R that never ran has few of either; one starved of CPU, many involuntary
    ones) and the CPUs it may run on (an affinity is inherited from the forking thread)."""
    try:
        fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line)
        cpus = "".join(c for c in fields.get("Cpus_allowed_list", "?").strip() if c in "0123456789,-?")[:40]
        return (f"ctxt={int(fields['voluntary_ctxt_switches'])}/{int(fields['nonvoluntary_ctxt_switches'])} "
                f"cpus={cpus or '?'}")
    except (OSError, KeyError, ValueError):
        return "ctxt=? cpus=?"


def _kernel_stack(pid: int, frames: int = 3) -> str:
    """'stack=f1<f2<f3': the innermost kernel functions of the process's main thread, where the
    server may read /proc/<pid>/stack (root); empty otherwise."""
    try:
        lines = open(f"/proc/{pid}/stack").read().splitlines()
    except OSError:
        return ""
    names = []
    for line in lines[:frames]:
        name = line.split("] ", 1)[-1].split("+", 1)[0]
        names.append("".join(c for c in name if c.isalnum() or c == "_")[:32])
    return "stack=" + "<".join(n for n in names if n) if names else ""


def kill_group(proc: mp.Process | None) -> None:
    """Kill a job process and its group. Once the process is reaped its pid may name another
    process (pids wrap: 32768 on many hosts), so it is never signalled by pid again; its group
    still is, since a group's id stays reserved while any member lives (what it started)."""
    if proc is None or proc.pid is None or proc.pid <= 0:
        return
    try:
        reaped = proc.exitcode is not None
    except (ValueError, OSError):  # a closed Process object
        return
    targets = [lambda: os.killpg(proc.pid, signal.SIGKILL)]
    if not reaped:
        targets.append(lambda: os.kill(proc.pid, signal.SIGKILL))
    for target in targets:
        try:
            target()
        except (ProcessLookupError, PermissionError, OSError):
            pass


def describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        detail = {"SIGSEGV": " (segmentation fault)", "SIGABRT": " (abort)", "SIGKILL": " (killed)",
                  "SIGBUS": " (bus error)", "SIGFPE": " (arithmetic error)"}.get(name, "")
        return f"was killed by {name}{detail}"
    if code >= 128 and code - 128 in {s.value for s in signal.Signals}:
        return describe_exit(-(code - 128))  # pid 1 of a jail reports a signal as 128+n
    return f"exited with code {code} (os._exit / sys.exit in candidate code?)"


def log_tail(path: Path) -> str:
    """The end of a trusted process's log (the reference's): never through a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        return log_tail_fd(fd)
    finally:
        os.close(fd)


def open_log(path: Path) -> int:
    """Create the candidate's log before its process exists, and keep a descriptor to read it by.
    The candidate can later rename, replace or symlink the name (to /dev/zero, a FIFO, the
    caller's ~/.netrc); the server reads this inode, never the path."""
    return os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def log_tail_fd(fd: int) -> str:
    """At most LOG_TAIL_BYTES from the end of a regular file, by position (pread): bounded in
    size and time, whatever the file's size or whoever else holds it."""
    import stat

    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return ""
        size = info.st_size
        start = max(0, size - LOG_TAIL_BYTES)
        data = os.pread(fd, min(size, LOG_TAIL_BYTES), start)
    except OSError:
        return ""
    return ("... [earlier output cut] ...\n" if start else "") + data.decode("utf-8", "replace")


def start_stacks(log_fd: int | None, limit: int = 3000) -> str:
    """The last Python stacks (every thread's) the candidate's process dumped while our code
    started it (faulthandler, every START_STACK_S s until stage 'load'), bounded and cleaned
    (text.clean_text: the log is the candidate process's), or ""."""
    if log_fd is None:
        return ""
    text = log_tail_fd(log_fd)
    at = text.rfind("Timeout (")
    if at < 0:
        return ""
    return clean_text(text[at:at + limit])


SANDBOX_FAILED = "kernelagent: could not enter the sandbox: "


def sandbox_failure(log_fd: int | None) -> str:
    """Why the candidate's jail could not be made: the line candidate_process wrote to the
    job's log before any candidate code existed (bounded, printable), or "" where there is none."""
    if log_fd is None:
        return ""
    lines = [line for line in log_tail_fd(log_fd).splitlines() if line.startswith(SANDBOX_FAILED)]
    if not lines:
        return ""
    why = lines[-1][len(SANDBOX_FAILED):][:300]
    return "".join(ch if ch.isprintable() else "?" for ch in why)


def candidate_process(job: dict[str, Any], conn: Connection, workdir: Path, jail: dict[str, Any]) -> None:
    """The candidate's process, first thing after the fork: the jail (namespaces, every other
    descriptor closed), then the log, then the candidate."""
    from kernelagent.harness import procname
    from kernelagent.harness.child import candidate_side
    from kernelagent.harness.jail import candidate as jail_mod
    from kernelagent.harness.child.common import child_setup
    from kernelagent.harness.trace import channel as trace_channel

    procname.set_name("ka-candidate")
    child_cuda_environ(job, candidate=True)

    log_path = workdir / "candidate.log"
    try:
        # The kernel tracer (issue 55) loaded and its variables set before the jail and CUDA's start.
        keep = [conn.fileno(), *trace_channel.prepare_child(job.get("trace"))]
        jail_mod.enter(workdir, jail, keep_fds=keep, log_path=log_path)
    except BaseException as exc:  # noqa: BLE001 - never run candidate code outside the jail asked for
        line = f"{SANDBOX_FAILED}{exc}\n".encode(errors="replace")
        try:
            try:
                with open(log_path, "ab") as log:
                    log.write(line)
            except OSError:  # a half-made jail (read-only root, hidden scratch): fd 2 is the log
                os.write(2, line)
        finally:
            os._exit(70)
    child_setup(log_path, workdir, keep)
    # While our own code starts (the CUDA context, the problem's import), the Python stack goes to
    # the log every START_STACK_S seconds, until stage 'load' cancels it before any candidate
    # line runs (candidate_side.run): a start that runs past its limit beside other jobs then
    # says where it was (job.py at_limit's candidate_stack).
    import faulthandler

    faulthandler.dump_traceback_later(START_STACK_S, repeat=True, file=sys.stderr)
    candidate_side.candidate_main(job, conn, workdir)


def reference_connections(environ: Mapping[str, str] | None = None) -> int | None:
    """What the reference's process sets CUDA_DEVICE_MAX_CONNECTIONS to, from
    KERNELAGENT_REFERENCE_CONNECTIONS (the server's choice, handed to the process in its job as
    `reference_connections`); None where the setting is 0 (CUDA's default, or the caller's, stays).

    Why: the driver makes and frees every CUDA context under one lock for the whole host, and the
    time it holds it grows with the context's hardware connections (8 by default). On two H200s of
    one host (scripts/device/driver_contention.py --raw) one context took 0.34 s to make and 0.075 s
    to free with 8, 0.19 s and 0.024 s with 1; 8 at once beside 8 on the other GPU, 2.65 s and 1.05 s
    against 1.52 s and 0.31 s. Every job makes two (its candidate's and its reference's), so a
    second GPU's jobs slowed this GPU's. The reference runs our code on one stream (the problem's
    model, eager and compiled, the empty timed loop), where a stream has one connection anyway: its
    work and timings are the same. The candidate's process has a setting of its own
    (candidate_connections: the caller's by default, so a kernel that uses streams is timed as its
    user will run it)."""
    return settings.get("KERNELAGENT_REFERENCE_CONNECTIONS", environ) or None


# A source that names these may spread its work over streams (or a graph's branches), which one
# connection would serialise: its process keeps the caller's setting.
_STREAMS = re.compile(r"stream|graph", re.IGNORECASE)


def candidate_connections(source: str, environ: Mapping[str, str] | None = None) -> tuple[int | None, str]:
    """What the candidate's process sets CUDA_DEVICE_MAX_CONNECTIONS to (None: nothing, the
    caller's stays) and why, from KERNELAGENT_CANDIDATE_CONNECTIONS (0, the default: nothing) and
    its source (the server's copy, read before the fork). One connection serialises streams, so a
    source that names a stream or a graph keeps the caller's: its kernels are timed as its user
    runs them. A candidate that hides its streams from this is only slowed by it, never helped."""
    wanted = settings.get("KERNELAGENT_CANDIDATE_CONNECTIONS", environ)
    if not wanted:
        return None, "default"
    if _STREAMS.search(source):
        return None, "default (the source names a stream or a graph)"
    return wanted, str(wanted)


def child_cuda_environ(job: dict[str, Any], *, candidate: bool,
                       environ: MutableMapping[str, str] | None = None) -> None:
    """A job's process's CUDA variables, set first thing after the fork (the server has no CUDA,
    so before the process's first CUDA call), as the server chose them (Start.child_job): the one
    GPU it uses (`cuda_visible`) and its connections (`cuda_connections`, the candidate's;
    `reference_connections`, the reference's)."""
    environ = os.environ if environ is None else environ
    if job.get("cuda_visible"):
        environ["CUDA_VISIBLE_DEVICES"] = str(job["cuda_visible"])
    connections = job.get("cuda_connections" if candidate else "reference_connections")
    if connections:
        environ["CUDA_DEVICE_MAX_CONNECTIONS"] = str(int(connections))


def reference_process(job: dict[str, Any], conn: Connection, workdir: Path) -> None:
    from kernelagent.harness import procname
    from kernelagent.harness.child import reference_side
    from kernelagent.harness.trace import channel as trace_channel

    procname.set_name("ka-reference")
    child_cuda_environ(job, candidate=False)

    # Traced as the candidate is (issue 55), so its baselines are timed under the same tracing.
    keep = trace_channel.prepare_child(job.get("trace"))
    reference_side.reference_main(job, conn, workdir, keep_fds=keep)


def namespace_members(pid: int) -> list[int]:
    """Every process of the pid namespace of `pid`'s first child, where it is not ours (the
    candidate's jail: server/job.py stop_candidate)."""
    try:
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
        namespace = os.readlink(f"/proc/{children[0]}/ns/pid") if children else None
    except (OSError, IndexError):
        namespace = None
    if not namespace or namespace == os.readlink("/proc/self/ns/pid"):
        return []
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == namespace:
                    members.append(int(entry))
            except OSError:
                continue
    return members
