"""Issue 59: where a cold baselines' compile goes (the critical path of a cold `kernelagent eval`).

A cold `eval` waits for its problem's torch.compile baselines: the reference process compiles the
problem's model and an "empty" one-op twin with Inductor, with empty caches. This probe runs that
compile in fresh processes, each with empty Inductor and Triton caches, in variants, interleaved,
and prints each phase:

- `default`: Inductor's own compile workers (min(32, CPUs): a subprocess pool);
- `t1`: TORCHINDUCTOR_COMPILE_THREADS=1 (the kernels compile in the process itself);
- `t1_pre`, `default_pre`: the same with Inductor's modules imported before the clock starts
  (what a server that preloads them would fork its jobs with);
- every variant then compiles a second problem in the same process (what a warm process pays).

    python scripts/device/inductor_cold_probe.py [--problems 5_softmax,2_gelu] [--reps 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import importlib.util, json, os, sys, time
t0 = time.perf_counter()
marks = {}
def mark(name):
    marks[name] = round(time.perf_counter() - t0, 3)
pre = os.environ.get("PROBE_PRE") == "1"
import torch
mark("import_torch")
import torch._dynamo
import triton
mark("import_dynamo")
if pre:
    import torch._inductor.compile_fx, torch._inductor.codegen.triton, torch._inductor.async_compile  # noqa
    import torch._inductor.runtime.triton_heuristics  # noqa
    mark("import_inductor")
t_clock = time.perf_counter()

def load(path):
    spec = importlib.util.spec_from_file_location("problem_" + str(abs(hash(path))), path)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); return mod

class Empty(torch.nn.Module):
    def forward(self, x):
        return x + 1

dev = torch.device("cuda")
out = {"pre": pre, "threads": os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")}
for i, path in enumerate(sys.argv[1:]):
    mod = load(path)
    model = mod.Model(*mod.get_init_inputs()).to(dev)
    xs = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
    torch.cuda.synchronize()
    s = time.perf_counter()
    compiled = torch.compile(model)
    with torch.no_grad():
        compiled(*xs)
    torch.cuda.synchronize()
    a = time.perf_counter()
    if i == 0:
        empty = torch.compile(Empty().to(dev))
        empty(torch.zeros(1, device=dev))
        torch.cuda.synchronize()
    b = time.perf_counter()
    out[f"problem{i}"] = {"path": os.path.basename(path), "compile_s": round(a - s, 3), "empty_s": round(b - a, 3)}
    if i == 0:
        out["first_total_s"] = round(b - t_clock, 3)
out["marks"] = marks
try:
    from torch._dynamo.utils import compile_times
    out["compile_times"] = str(compile_times(repr="str", aggregate=True))[-1500:]
except Exception as exc:  # noqa: BLE001
    out["compile_times"] = repr(exc)
print("PROBE " + json.dumps(out), flush=True)
"""

VARIANTS = {
    "default": {"PROBE_PRE": "0"},
    "t1": {"PROBE_PRE": "0", "TORCHINDUCTOR_COMPILE_THREADS": "1"},
    "default_pre": {"PROBE_PRE": "1"},
    "t1_pre": {"PROBE_PRE": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"},
}


def run_one(name: str, paths: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="probe-cache.") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
        env.update(VARIANTS[name], TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor", TRITON_CACHE_DIR=f"{tmp}/triton")
        env.pop("PYTHONPATH", None)
        proc = subprocess.run([sys.executable, "-c", CHILD, *paths], env=env, capture_output=True, text=True,
                              timeout=240, cwd=tmp)
    for line in proc.stdout.splitlines():
        if line.startswith("PROBE "):
            return dict(json.loads(line[6:]), variant=name, rc=proc.returncode)
    return {"variant": name, "rc": proc.returncode, "error": proc.stderr[-2000:]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", default="5_softmax,2_gelu")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--variants", default="default,t1,default_pre,t1_pre")
    args = parser.parse_args()
    paths = [str(ROOT / "benchmarks" / "level1" / f"{p}.py") for p in args.problems.split(",")]
    variants = args.variants.split(",")
    rows = []
    for rep in range(args.reps):
        for name in variants:
            row = run_one(name, paths)
            row["rep"] = rep
            rows.append(row)
            brief = {k: row.get(k) for k in ("first_total_s", "marks", "problem0", "problem1", "error")}
            print(f"{name} rep {rep}: {json.dumps(brief)}", flush=True)
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "inductor_cold_probe.json").write_text(json.dumps(rows, indent=1))
    print("\nsummary: variant | first compile + empty twin (s), median | second problem in the same process")
    for name in variants:
        mine = [r for r in rows if r["variant"] == name and "first_total_s" in r]
        if mine:
            first = statistics.median(r["first_total_s"] for r in mine)
            second = statistics.median(r.get("problem1", {}).get("compile_s", float("nan")) for r in mine)
            print(f"{name} | {first:.2f} | {second:.2f}")
    last = next((r for r in reversed(rows) if "compile_times" in r), None)
    if last:
        print("\ncompile_times of the last run:\n" + last["compile_times"])


if __name__ == "__main__":
    main()
