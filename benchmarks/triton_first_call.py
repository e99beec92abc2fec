"""Where a Triton candidate's first call goes in a fresh process (issue 39: 0.7 s of the kernel
evidence's warm-up on an H100 with the kernel already in the cache).

    python benchmarks/triton_first_call.py [--solution S] [--problem P] [--cache DIR] [--profile]

Times, in this process: importing torch and triton, the candidate's import, the first call (its
kernels compiled or loaded from TRITON_CACHE_DIR), the second call; with --profile, the first
call's top functions by cumulative time. Run it twice with the same --cache: cold, then warm.
Prints one JSON line. Needs a GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problem", type=Path, default=HERE / "level1" / "5_softmax.py")
    parser.add_argument("--solution", type=Path, default=HERE / "solutions" / "level1" / "5_softmax.py")
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    os.environ["TRITON_CACHE_DIR"] = str(args.cache)
    row: dict = {"cache_entries_before": len(list(args.cache.rglob("*"))) if args.cache.exists() else 0}
    t = time.monotonic()
    import torch

    row["import_torch_s"] = round(time.monotonic() - t, 3)
    t = time.monotonic()
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    row["import_triton_s"] = round(time.monotonic() - t, 3)
    torch.ones(1, device="cuda").add_(1)
    torch.cuda.synchronize()
    problem = _load(args.problem, "problem")
    t = time.monotonic()
    candidate = _load(args.solution, "candidate")
    row["import_candidate_s"] = round(time.monotonic() - t, 3)
    model = candidate.ModelNew(*problem.get_init_inputs()).cuda()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in problem.get_inputs()]
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    t = time.monotonic()
    with torch.no_grad():
        model(*inputs)
        torch.cuda.synchronize()
    row["first_call_s"] = round(time.monotonic() - t, 3)
    if profiler is not None:
        import io
        import pstats

        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(25)
        row["profile"] = [line.strip()[:160] for line in out.getvalue().splitlines() if line.strip()][:45]
    t = time.monotonic()
    with torch.no_grad():
        model(*inputs)
        torch.cuda.synchronize()
    row["second_call_s"] = round(time.monotonic() - t, 4)
    row["cache_entries_after"] = len(list(args.cache.rglob("*")))
    row["cache_files"] = sorted(p.name for p in args.cache.rglob("*") if p.is_file())[:30]
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
