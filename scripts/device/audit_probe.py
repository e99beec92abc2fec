"""Issue 55: where the slot time of one ncu audit goes, and what shortens it.

An audit (server/kernel_evidence.Early) holds the device's timing slot from GO to the end of its
ncu session: the target's warm-up (the candidate's first call loads its kernels under ncu), the
profiled calls (CALLS forward calls, each kernel profiled alone), then the teardown (the
target's exit, ncu writing its report). This probe runs the same session as the server does
(ncu.prepare, the same jail, ncu_session.NcuSession with the two-phase handshake, the
candidate's Triton cache staged from a run before) on our own problems and solutions, in
variants, interleaved, and prints each variant's phases and what ncu saw:

- `calls1`: today's session (CALLS = 1; the target ends with os._exit once it printed DONE:
  ncu_entry._exit_done);
- `calls2`: two profiled calls (CALLS before);
- `calls1_cexit`, `calls2_cexit`: the target ends through C's exit(), its libraries' exit
  handlers run (CUDA destroying its context): ncu_entry._exit_fast, before;
- `calls1_nocache`: `--cache-control none`;
- `bare`: the same target and handshake without ncu (what the warm-up costs without it).

    python scripts/device/audit_probe.py [--problems 5_softmax,1_relu] [--reps 2]
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CEXIT = ("import sys\n"
         "from kernelagent.harness.child import ncu_entry\n"
         "ncu_entry._exit_fast(ncu_entry.main(sys.argv[1:]))\n")


def warm_triton_cache(problem: Path, solution: Path, cache: Path) -> None:
    code = ("import importlib.util, sys, torch\n"
            "def load(p, n):\n"
            "    s = importlib.util.spec_from_file_location(n, p); m = importlib.util.module_from_spec(s)\n"
            "    s.loader.exec_module(m); return m\n"
            "p, c = load(sys.argv[1], 'problem'), load(sys.argv[2], 'candidate')\n"
            "with torch.device('cuda'):\n"
            "    m = c.ModelNew(*p.get_init_inputs())\n"
            "    x = [t.cuda() if hasattr(t, 'cuda') else t for t in p.get_inputs()]\n"
            "with torch.no_grad():\n"
            "    m(*x); torch.cuda.synchronize()\n")
    subprocess.run([sys.executable, "-c", code, str(problem), str(solution)], check=True, timeout=120,
                   env=dict(os.environ, TRITON_CACHE_DIR=str(cache)))


def one(variant: str, problem: Path, solution: Path, cache: Path) -> dict:
    from kernelagent.harness import interpreter
    from kernelagent.harness.server import kernel_evidence, ncu
    from kernelagent.harness.server.ncu_session import NcuSession

    source = solution.read_text()
    calls = 2 if variant.startswith("calls2") else 1
    setup = ncu.prepare(problem, source, backend="triton", device="cuda:0", kernel_names=None, calls=calls,
                        cache_dir=None, candidate_sha=hashlib.sha256(source.encode()).hexdigest(),
                        allow_unsandboxed=False, launch_count=100_000, hide=None, scratch_parent=None,
                        namespaces=True, triton_cache=cache, clock_control="none", run_as=None)
    if isinstance(setup, dict):
        return {"variant": variant, "unavailable": setup.get("unavailable")}
    try:
        setup.env["KERNELAGENT_NCU_WAIT_S"] = "60"
        if variant.endswith("_cexit"):
            setup.app = interpreter.code_argv(CEXIT, *setup.app[-4:])
        argv = setup.argv(kernel_evidence.METRICS)
        at = argv.index(setup.ncu)
        if variant == "calls1_nocache":
            argv[at + 1:at + 1] = ["--cache-control", "none"]
        if variant == "bare":
            argv = argv[:at] + setup.app
        started = time.monotonic()
        session = NcuSession(argv, setup.scratch, setup.env, handshake=True, two_phase=True)
        proc = session.run(120, contextlib.nullcontext)
        row = {"variant": variant, "problem": problem.stem, "phases": dict(getattr(proc, "phases", {}) or {}),
               "wall_s": round(time.monotonic() - started, 3)}
        if variant != "bare":
            got = ncu.read_session(setup, proc, 120, None, 1000, started)
            row["kernels"] = [(k.get("name"), k.get("launches"), k.get("total_ns")) for k in got.get("kernels", [])]
            row["unavailable"] = got.get("unavailable")
        if proc is not None and "KERNELAGENT_NCU_DONE" not in proc.stdout:
            row["tail"] = proc.stdout[-600:]
        return row
    finally:
        setup.remove()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", default="5_softmax,1_relu")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--variants", default="calls2_cexit,calls1,calls1_cexit,calls2,bare")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    import torch

    # The target's first `with torch.device` imports torch.utils._device: on a fresh machine its
    # bytecode would be written then, under the monitor (a flag the server's jobs never meet).
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(Path(torch.__file__).parent / "utils")],
                   timeout=300, check=False)
    rows = []
    for name in args.problems.split(","):
        problem = ROOT / "benchmarks" / "level1" / f"{name}.py"
        solution = ROOT / "benchmarks" / "solutions" / "level1" / f"{name}.py"
        cache = Path(tempfile.mkdtemp(prefix="audit-probe-triton-"))
        warm_triton_cache(problem, solution, cache)
        for rep in range(args.reps):
            for variant in args.variants.split(","):
                row = one(variant, problem, solution, cache)
                row["rep"] = rep
                rows.append(row)
                p = row.get("phases", {})
                slot = p.get("profiled_s")
                print(f"{name} {variant} rep {rep}: slot {slot} (warm {p.get('warm_s')}, first "
                      f"{p.get('target_first_s')}, profiled-stamp {p.get('target_profiled_s')}) "
                      f"kernels {row.get('kernels')} {row.get('unavailable') or ''} {row.get('tail', '')[-200:]}",
                      flush=True)
    (out / "audit_probe.json").write_text(json.dumps(rows, indent=1))
    print("\nmedian slot held (GO to the session's end), s:")
    for name in args.problems.split(","):
        for variant in args.variants.split(","):
            phases = [r["phases"] for r in rows if r.get("problem") == name and r["variant"] == variant
                      and "profiled_s" in r.get("phases", {})]
            slots = [p["profiled_s"] for p in phases]
            teardown = [p["profiled_s"] - p.get("target_profiled_s", 0) for p in phases]
            if slots:
                print(f"  {name:12s} {variant:15s} {statistics.median(slots):.3f}  teardown "
                      f"{statistics.median(teardown):.3f}  n={len(slots)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
