"""Where the host's CPU goes while a command (or a block of code) runs: per process kind.

    python benchmarks/host_cpu.py --out cpu.json -- kernelagent eval P C
    python benchmarks/host_cpu.py --tree --out cpu.json -- ...     # also the per-pid rows

or, in a script, `with HostCpu() as cpu: ...; cpu.report()`.

A thread reads /proc every `interval` seconds: every process that is, or ever was seen as, a
descendant of this one (ppid chain; a process in a pid namespace of its own is still seen from
here), its own user+system CPU time (never its children's, so nothing counts twice) and what it
is (`kind`, below). A process that lives shorter than the interval can be missed; the reaped
totals (RUSAGE_CHILDREN of this process, everything reaped below it) and the machine's own
CPU counters (/proc/stat: every process on the host) bound what was missed.

Kinds, by the name the harness gives its processes (prctl PR_SET_NAME: `ka-server`,
`ka-reference`, `ka-candidate`, `ka-probe`, `ka-fork`) and by command line: `ncu` (Nsight
Compute's host process), `ncu-target` (the candidate's process under it,
child/ncu_entry.py), `jail-exec`, `compile-worker` (Inductor's), `toolchain` (nvcc, ptxas,
cicc, gcc, ninja, ld), `caller` (this process), `other`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")
TOOLCHAIN = {"nvcc", "ptxas", "cicc", "fatbinary", "nvlink", "gcc", "g++", "cc1", "cc1plus", "as", "ld",
             "collect2", "ninja", "c++", "x86_64-linux-gnu-gcc"}


def _stat(pid: str) -> tuple[int, str, float, int] | None:
    """(ppid, comm, own cpu seconds, start time in ticks) of a process, or None when it is gone."""
    try:
        raw = open(f"/proc/{pid}/stat", "rb").read().decode(errors="replace")
    except OSError:
        return None
    close = raw.rfind(")")
    comm = raw[raw.find("(") + 1:close]
    fields = raw[close + 2:].split()
    # fields[0] is state; ppid is fields[1]; utime, stime are fields[11], fields[12]; starttime fields[19]
    return int(fields[1]), comm, (int(fields[11]) + int(fields[12])) / TICK, int(fields[19])


def _cmdline(pid: str) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")[:300]
    except OSError:
        return ""


def classify(comm: str, cmdline: str, caller: bool = False) -> str:
    if caller:
        return "caller"
    if comm.startswith("ka-"):
        return comm[3:]
    if comm == "ncu" or cmdline.split(" ", 1)[0].endswith("/ncu"):
        return "ncu"
    if "kernelagent.harness.child.ncu_entry" in cmdline:
        return "ncu-target"
    if "kernelagent.harness.jail.exec_in" in cmdline:
        return "jail-exec"
    if "compile_worker" in cmdline or "_inductor" in cmdline:
        return "compile-worker"
    if comm in TOOLCHAIN:
        return "toolchain"
    if "kernelagent.harness.server" in cmdline:
        return "server"
    return "other"


def machine_cpu_seconds() -> float:
    """Every CPU's user+nice+system+irq+softirq+steal time on the host, in seconds (/proc/stat)."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    values = [int(x) for x in parts]
    busy = sum(values[:3]) + sum(values[5:8])  # user nice system (idle iowait) irq softirq steal
    return busy / TICK


class HostCpu:
    """Samples the process tree below this process; `report()` sums CPU seconds by kind."""

    def __init__(self, interval: float = 0.2, root: int | None = None):
        self.interval = interval
        self.root = root or os.getpid()
        self.procs: dict[tuple[int, int], dict[str, Any]] = {}  # (pid, starttime) -> row
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-cpu", daemon=True)

    def __enter__(self) -> "HostCpu":
        self.started = time.monotonic()
        self.machine0 = machine_cpu_seconds()
        self.reaped0 = self._reaped()
        self.own0 = self._own()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)
        self._scan()
        self.wall = time.monotonic() - self.started
        self.machine = machine_cpu_seconds() - self.machine0
        self.reaped = self._reaped() - self.reaped0
        self.own = self._own() - self.own0

    @staticmethod
    def _reaped() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    @staticmethod
    def _own() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._scan()

    def _scan(self) -> None:
        table = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                st = _stat(entry)
                if st is not None:
                    table[int(entry)] = st
        known = {pid for (pid, start) in self.procs if (pid in table and table[pid][3] == start)}
        known.add(self.root)
        changed = True
        while changed:  # descendants of the root, or of anything seen below it before
            changed = False
            for pid, (ppid, _comm, _cpu, _start) in table.items():
                if pid not in known and ppid in known:
                    known.add(pid)
                    changed = True
        for pid in known:
            if pid not in table:
                continue
            ppid, comm, cpu, start = table[pid]
            key = (pid, start)
            row = self.procs.get(key)
            if row is None:
                cmd = _cmdline(str(pid))
                row = self.procs[key] = {"pid": pid, "ppid": ppid, "comm": comm, "cmd": cmd,
                                         "first_cpu": cpu, "cpu": cpu, "seen": time.monotonic() - self.started}
            row["cpu"] = max(row["cpu"], cpu)
            if row["comm"] != comm:  # renamed (prctl) or exec'd since first seen
                row["comm"], row["cmd"] = comm, _cmdline(str(pid)) or row["cmd"]

    def report(self, evaluations: int | None = None, tree: bool = False) -> dict[str, Any]:
        by_kind: dict[str, dict[str, float]] = {}
        for row in self.procs.values():
            kind = classify(row["comm"], row["cmd"], caller=row["pid"] == self.root)
            cpu = row["cpu"] - (row["first_cpu"] if row["pid"] == self.root else 0.0)
            k = by_kind.setdefault(kind, {"cpu_s": 0.0, "processes": 0})
            k["cpu_s"] += cpu
            k["processes"] += 1
        sampled = sum(k["cpu_s"] for k in by_kind.values())
        out: dict[str, Any] = {
            "wall_s": round(self.wall, 2), "machine_cpu_s": round(self.machine, 2),
            "sampled_cpu_s": round(sampled, 2), "reaped_cpu_s": round(self.reaped, 2),
            "caller_cpu_s": round(self.own, 2), "cores": os.cpu_count(),
            "by_kind": {k: {"cpu_s": round(v["cpu_s"], 2), "processes": int(v["processes"])}
                        for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]["cpu_s"])},
        }
        if evaluations:
            out["evaluations"] = evaluations
            out["machine_cpu_s_per_evaluation"] = round(self.machine / evaluations, 2)
            out["sampled_cpu_s_per_evaluation"] = round(sampled / evaluations, 2)
        if tree:
            out["processes"] = sorted(({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}
                                       for row in self.procs.values()), key=lambda r: -r["cpu"])[:300]
        return out


def print_report(rep: dict[str, Any], file: Any = sys.stdout) -> None:
    print(f"host CPU: {rep['machine_cpu_s']} CPU-s on the machine ({rep['sampled_cpu_s']} sampled below the "
          f"caller, {rep['reaped_cpu_s']} reaped) in {rep['wall_s']} s wall, {rep['cores']} cores", file=file)
    if "evaluations" in rep:
        print(f"  per evaluation: {rep['machine_cpu_s_per_evaluation']} CPU-s (machine), "
              f"{rep['sampled_cpu_s_per_evaluation']} (sampled)", file=file)
    print("  by kind: " + ", ".join(f"{k} {v['cpu_s']} s/{v['processes']}p" for k, v in rep["by_kind"].items()),
          file=file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the report as JSON")
    parser.add_argument("--tree", action="store_true", help="also every process's row")
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--evaluations", type=int, default=None, help="divide by this many evaluations")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (after --)")
    with HostCpu(args.interval) as cpu:
        rc = subprocess.call(command)
    rep = cpu.report(args.evaluations, args.tree)
    rep["command"], rep["rc"] = command, rc
    print_report(rep, sys.stderr)
    if args.out:
        args.out.write_text(json.dumps(rep, indent=1) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
