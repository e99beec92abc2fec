"""Issue 59: where a cold `eval`'s baselines process spends its seconds, phase by phase.

A cold `kernelagent eval` waits for its problem's baselines job: a process forked from the
harness server (torch, torch._dynamo and Triton imported there) that initialises CUDA, loads the
problem, imports Inductor, compiles the model and an empty twin, and times them. This probe does
the same in a fresh process with empty Inductor and Triton caches, then prints:

- each phase's wall seconds (`phases`), in the order the baselines job runs them;
- the functions under cProfile with the most cumulative and the most own time in the import and
  compile phases (a subprocess or a device query shows up there, not only Python);
- with `--importtime`, the modules whose own import time is largest during Inductor's import
  (`python -X importtime` in a second fresh process).

    python scripts/device/baselines_path_profile.py [--problem 5_softmax] [--importtime] [--top 25]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import cProfile, importlib.util, io, json, os, pstats, sys, time
t0 = time.perf_counter()
phases = {}
last = [t0]
def lap(name):
    now = time.perf_counter(); phases[name] = round(now - last[0], 3); last[0] = now
import torch
lap("import_torch")
import torch._dynamo, triton
lap("import_dynamo_triton (the server's)")
profiles = {}
def profiled(name, fn):
    prof = cProfile.Profile(); prof.enable()
    try:
        return fn()
    finally:
        prof.disable(); lap(name); profiles[name] = prof
dev = torch.device("cuda")
profiled("cuda_init", lambda: torch.zeros(1, device=dev))
def load():
    spec = importlib.util.spec_from_file_location("problem_probe", sys.argv[1])
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    model = mod.Model(*mod.get_init_inputs()).to(dev)
    xs = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
    torch.cuda.synchronize()
    return model, xs
model, xs = profiled("load", load)
def imp():
    import torch._inductor.compile_fx, torch._inductor.codegen.triton, torch._inductor.async_compile  # noqa
    import torch._inductor.runtime.triton_heuristics  # noqa
profiled("import_inductor", imp)
class Empty(torch.nn.Module):
    def forward(self, x):
        return x + 1
def comp():
    with torch.no_grad():
        torch.compile(model)(*xs)
    torch.cuda.synchronize()
profiled("compile_model", comp)
def comp_empty():
    torch.compile(Empty().to(dev))(torch.zeros(1, device=dev)); torch.cuda.synchronize()
profiled("compile_empty", comp_empty)
out = {"phases": phases, "total_s": round(time.perf_counter() - t0, 3), "top": {}}
top = int(os.environ.get("PROBE_TOP", "25"))
for name in ("cuda_init", "import_inductor", "compile_model"):
    for key in ("cumulative", "tottime"):
        s = io.StringIO()
        pstats.Stats(profiles[name], stream=s).sort_stats(key).print_stats(top)
        out["top"][f"{name}/{key}"] = s.getvalue()[-6000:]
print("PROBE " + json.dumps(out), flush=True)
"""

IMPORTTIME = r"""
import torch, torch._dynamo, triton
torch.zeros(1, device="cuda")
import sys
print("MARK inductor", file=sys.stderr, flush=True)
import torch._inductor.compile_fx, torch._inductor.codegen.triton, torch._inductor.async_compile  # noqa
import torch._inductor.runtime.triton_heuristics  # noqa
"""


def fresh_env(tmp: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env.update(TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor", TRITON_CACHE_DIR=f"{tmp}/triton")
    env.pop("PYTHONPATH", None)
    return env


def importtime(top: int) -> str:
    with tempfile.TemporaryDirectory(prefix="probe-cache.") as tmp:
        proc = subprocess.run([sys.executable, "-X", "importtime", "-c", IMPORTTIME], env=fresh_env(tmp),
                              capture_output=True, text=True, timeout=240, cwd=tmp)
    text = proc.stderr.split("MARK inductor", 1)[-1]
    rows = []
    for line in text.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            rows.append((int(m.group(1)), int(m.group(2)), len(m.group(3)) // 2, m.group(4)))
    total = sum(r[0] for r in rows)
    lines = [f"modules imported for Inductor: {len(rows)}, own time {total / 1e6:.3f} s; largest own times:"]
    lines += [f"  {own / 1e6:.3f} s own, {cum / 1e6:.3f} s cumulative, depth {depth}: {name}"
              for own, cum, depth, name in sorted(rows, reverse=True)[:top]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="where a cold baselines process spends its seconds")
    parser.add_argument("--problem", default="5_softmax")
    parser.add_argument("--importtime", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    path = str(ROOT / "benchmarks" / "level1" / f"{args.problem}.py")
    with tempfile.TemporaryDirectory(prefix="probe-cache.") as tmp:
        env = dict(fresh_env(tmp), PROBE_TOP=str(args.top))
        proc = subprocess.run([sys.executable, "-c", CHILD, path], env=env, capture_output=True, text=True,
                              timeout=300, cwd=tmp)
    found = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    if not found:
        print(f"probe failed, rc {proc.returncode}:\n{proc.stderr[-3000:]}")
        sys.exit(1)
    out = json.loads(found[0][6:])
    print(f"phases (s): {out['phases']}; total {out['total_s']} s")
    for name, text in out["top"].items():
        print(f"==== {name}\n{text}")
    if args.importtime:
        print("==== importtime\n" + importtime(args.top))


if __name__ == "__main__":
    main()
