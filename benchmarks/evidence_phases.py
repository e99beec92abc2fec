"""Where the kernel evidence's seconds go, phase by phase, outside any server (issue 39).

One Nsight Compute session as the harness runs it (server/ncu.py `prepare`, the per-job jail,
the READY/GO/WARMED/GO2 handshake of server/ncu_session.py), driven by this script instead of a
server, with the target's own stamps and, read from /proc, when the target process itself ended
(before ncu's host process wrote the report and ended). Variants:

- `plain`: the same target with the same jail and handshake but no ncu (Triton's own first call);
- `ncu`: the session as the server runs it (`--calls`);
- `stop`: the same, with the whole session stopped (SIGSTOP) and continued three times while the
  candidate warms up: can a holder's freeze reach it then, and does it still finish?

    python benchmarks/evidence_phases.py [--repeats 3] [--calls 2] [--variants plain,ncu,stop]
        [--problem P --solution S] [--out phases.json]

Needs a GPU and ncu; prints one line per session and writes every row as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _target_pids(leader: int) -> list[int]:
    """Processes of the session led by `leader` whose command line runs ncu_entry."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) != leader:
                continue
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except (OSError, ProcessLookupError):
            continue
        if b"ncu_entry" in cmd and b"ncu\x00" not in cmd.split(b"ncu_entry")[0][-5:]:
            found.append(int(entry))
    return found


def one(variant: str, problem: Path, solution: Path, calls: int, triton_cache: Path | None,
        keep_cache: Path | None) -> dict:
    from kernelagent.harness.server import ncu
    from kernelagent.harness.server.ncu_session import NcuSession, reap
    from kernelagent.harness.child.ncu_entry import GO_FILE

    run_as = (65534, 65534) if os.geteuid() == 0 else None
    setup = ncu.prepare(problem, solution.read_text(), backend="triton", device="cuda", kernel_names=None,
                        calls=calls, cache_dir=None, candidate_sha="x", allow_unsandboxed=False,
                        launch_count=100_000, hide=[], scratch_parent=None, namespaces=True, triton_cache=None,
                        clock_control="none", run_as=run_as)
    if isinstance(setup, dict):
        return {"variant": variant, "unavailable": setup.get("unavailable")}
    row: dict = {"variant": variant, "calls": calls}
    try:
        setup.stage_triton_cache(triton_cache, run_as)
        argv = setup.argv(["gpu__time_duration.sum"])
        if variant == "plain":
            argv = setup.base[:setup.base.index(setup.ncu)] + setup.app
        spawned = time.monotonic()
        session = NcuSession(argv, setup.scratch, setup.env, handshake=True, two_phase=True)
        session.ready.wait(120)
        t_ready = time.monotonic()
        (setup.scratch / GO_FILE).touch()
        go = time.monotonic()
        if variant == "stop":
            stops = []
            for _ in range(3):
                time.sleep(0.15)
                if session.warmed.is_set():
                    break
                t0 = time.monotonic()
                os.killpg(session.proc.pid, signal.SIGSTOP)
                time.sleep(0.3)
                os.killpg(session.proc.pid, signal.SIGCONT)
                stops.append(round(time.monotonic() - t0, 3))
            row["stops_s"] = stops
        session.warmed.wait(120)
        warmed = time.monotonic()
        targets = _target_pids(session.proc.pid)
        (setup.scratch / (GO_FILE + "2")).touch()
        go2 = time.monotonic()
        target_gone = None
        while session.proc.poll() is None and time.monotonic() - go2 < 120:
            if target_gone is None and targets and not any(Path(f"/proc/{p}").exists()
                                                           and b"ncu_entry" in _cmd(p) for p in targets):
                target_gone = time.monotonic()
            time.sleep(0.002)
        ended = time.monotonic()
        cpu = reap(session.proc, 5) or 0.0
        session._reader.join(5)
        out = "".join(session.lines)
        row.update(
            ok="KERNELAGENT_NCU_DONE" in out, rc=session.proc.returncode,
            to_ready_s=round(t_ready - spawned, 3), warm_s=round(warmed - go, 3),
            go2_to_target_exit_s=round(target_gone - go2, 3) if target_gone else None,
            target_exit_to_end_s=round(ended - target_gone, 3) if target_gone else None,
            go2_to_end_s=round(ended - go2, 3), session_cpu_s=round(cpu, 2), target_pids=len(targets),
            stamps={k: round(v - go, 3) for k, v in session.stamps.items()})
        if "profiled" in session.stamps:
            row["go2_to_profiled_s"] = round(session.stamps["profiled"] - go2, 3)
        if not row["ok"]:
            row["tail"] = out[-800:]
        rep = setup.report.with_suffix(".ncu-rep")
        if variant != "plain" and rep.exists():
            t0 = time.monotonic()
            imported, _ = ncu.run_counted([setup.ncu, "--import", str(rep), "--csv", "--page", "raw"], 60)
            row["import_s"] = round(time.monotonic() - t0, 3)
            rows = ncu.parse_ncu_csv(imported.stdout)
            row["kernels"] = [(r.get("Kernel Name", "")[:40], r.get("gpu__time_duration.sum")) for r in rows][:8]
        if keep_cache is not None and (setup.scratch / ".triton").is_dir():
            shutil.copytree(setup.scratch / ".triton", keep_cache, dirs_exist_ok=True)
    finally:
        setup.remove()
    return row


def _cmd(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problem", default=str(ROOT / "benchmarks/level1/5_softmax.py"))
    parser.add_argument("--solution", default=str(ROOT / "benchmarks/solutions/level1/5_softmax.py"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", default="2", help="profiled calls, comma-separated variants (e.g. 2,1)")
    parser.add_argument("--variants", default="plain,ncu,stop")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="ka-phases-triton-"))
    if os.geteuid() == 0:
        os.chmod(cache, 0o755)
    rows = []
    # The first session compiles the candidate's kernels; its cache is staged into the others,
    # as the server stages the job's own.
    first = one("plain", Path(args.problem), Path(args.solution), 2, None, cache)
    first["variant"] = "plain-cold"
    rows.append(first)
    print(json.dumps(first), flush=True)
    for variant in args.variants.split(","):
        for calls in [int(c) for c in args.calls.split(",")]:
            if variant == "plain" and calls != int(args.calls.split(",")[0]):
                continue
            for _ in range(args.repeats):
                row = one(variant, Path(args.problem), Path(args.solution), calls, cache, None)
                rows.append(row)
                print(json.dumps(row), flush=True)
    shutil.rmtree(cache, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
