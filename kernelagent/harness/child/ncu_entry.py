"""The process Nsight Compute profiles (`kernelagent profile`): loads the problem and the
candidate the same way the candidate's process of an evaluation does, warms up, and runs a
few calls inside cudaProfilerStart/Stop.

    python -m kernelagent.harness.child.ncu_entry PROBLEM CANDIDATE BACKEND CALLS

Run by caller/profiling.py under `ncu`, in a scratch directory holding the candidate, with a
scrubbed environment; the CUDA build cache reaches it only as a copy in that directory, staged
and hash-checked by the caller (server/build_cache.py). It prints one line
`KERNELAGENT_NCU_DONE {violations}` when it finished; under the harness server it also says
`KERNELAGENT_NCU_READY` before it imports the candidate, and waits for the device
(_wait_for_the_device).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from kernelagent import settings


def main(argv: list[str]) -> int:
    problem_path, candidate_path, backend, calls = argv[0], argv[1], argv[2], int(argv[3])
    import torch

    from kernelagent.harness.child import defences, inputs as inputs_mod
    from kernelagent.harness.child.common import clean_numeric_modes, count_devices_through_cuda
    from kernelagent.harness.config import EvalConfig

    config = EvalConfig(backend=backend)
    device = torch.device("cuda:0")
    count_devices_through_cuda()  # no nvmlInit in the session's start (child/common.py)
    torch.cuda.set_device(device)
    clean_numeric_modes()
    # One kernel of ours before READY, synchronised: Nsight Compute's injection finishes setting
    # up at a process's first launch, which would otherwise cost the candidate's first call with
    # the device held (docs/concepts/concurrency.md, "Less around the loop").
    torch.ones(1, device=device).add_(1)
    torch.cuda.synchronize(device)
    problem = inputs_mod.import_file(Path(problem_path), "kernelagent_problem")
    sys.modules.pop("kernelagent_problem", None)
    scratch = Path(os.getcwd())
    builder = None
    if backend == "cuda":
        from kernelagent.harness.child import cuda_build

        capability = "%d.%d" % torch.cuda.get_device_capability(device)
        os.environ["TORCH_CUDA_ARCH_LIST"] = capability
        builder = cuda_build.BuildHook(scratch, scratch / ".ka-build-cache",
                                       settings.get("KERNELAGENT_CANDIDATE_SHA"), capability)
        builder.install()
    if backend == "triton":
        # Triton's import and its cache key, before the device is held: the candidate's first
        # call then loads its kernels only (child/triton_warm.py: 0.6 -> ~0.05 s on an H100).
        from kernelagent.harness.child import triton_warm

        triton_warm.warm()
    monitor = defences.Monitor(Path(candidate_path), scratch, config, builder=builder)
    monitor.install()
    _wait_for_the_device()  # from here on the candidate's code runs
    _stamp("go")
    module = inputs_mod.import_file(Path(candidate_path), "candidate")
    _stamp("imported")
    init = inputs_mod.init_inputs(problem, False, device, config.weight_seed)
    model = inputs_mod.build_model(module.ModelNew, init, device, config.weight_seed)
    values = inputs_mod.make_inputs(problem, "main", 0, False, device)
    _stamp("built")
    with torch.no_grad():
        for i in range(3):  # compile, autotune and warm up outside the profiled range
            model(*values)
            if i == 0:
                torch.cuda.synchronize()
                _stamp("first")
        torch.cuda.synchronize()
        _stamp("warmed")
        if settings.get("KERNELAGENT_NCU_TWO_PHASE"):
            # the profiled calls run once the server has stopped every other job (server/evidence.py)
            print("KERNELAGENT_NCU_WARMED", flush=True)
            _wait_for(GO_FILE + "2")
        torch.cuda.cudart().cudaProfilerStart()
        for _ in range(calls):
            model(*values)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    _stamp("profiled")
    print("KERNELAGENT_NCU_DONE " + json.dumps(dict(monitor.state.violations)), flush=True)
    return 0


def _stamp(name: str) -> None:
    """A progress line for the evidence's phases (server/evidence.py): informational only, from
    the candidate's process (it could print its own), never used to decide anything."""
    if settings.get("KERNELAGENT_NCU_HANDSHAKE"):
        import time

        print(f"KERNELAGENT_NCU_T {name} {time.monotonic():.4f}", flush=True)


def _exit_done(code: int) -> None:
    """End a finished session at once: os._exit, without Python's teardown or the libraries' exit
    handlers (CUDA destroying its context took ~0.25 s with the device held; H200,
    scripts/device/audit_probe.py). Nsight Compute's host already holds every profiled kernel's
    result: each kernel is profiled, and its result sent, at its launch, inside the profiled
    range that ended before DONE; the host writes its report once this process is gone."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_fast(code: int) -> None:
    """End without Python's own teardown (torch's modules take most of a second): C's exit()
    still runs the libraries' exit handlers, Nsight Compute's injection and CUDA's among them,
    so the session's results are written as with a normal exit."""
    import ctypes

    sys.stdout.flush()
    sys.stderr.flush()
    try:
        ctypes.CDLL(None).exit(code)
    except Exception:  # noqa: BLE001 - the slow way, then
        pass
    sys.exit(code)


GO_FILE = "kernelagent-go"


def _wait_for_the_device() -> None:
    """Under the harness server (KERNELAGENT_NCU_HANDSHAKE), the candidate's code waits for the
    device's timing slot: our own set-up (torch, the CUDA context, the problem) is done, so say
    READY, then wait until the server, holding the slot with every other job stopped and the
    device idle, creates GO_FILE in the scratch. Elsewhere (`kernelagent profile`) nothing waits.
    Nothing of the candidate's has run before this point."""
    if not settings.get("KERNELAGENT_NCU_HANDSHAKE"):
        return
    print("KERNELAGENT_NCU_READY", flush=True)
    _wait_for(GO_FILE)


def _wait_for(name: str) -> None:
    """Until the server creates `name` in the scratch."""
    import time

    go = Path(os.getcwd()) / name
    pause = 0.001
    # A session started early (server/evidence.py) may wait here while the job's checks run; it
    # gives up by itself when its scratch is removed (the server or its caller went away) or
    # after KERNELAGENT_NCU_WAIT_S, so nothing of it outlives the job.
    until = time.monotonic() + settings.get("KERNELAGENT_NCU_WAIT_S")
    while not go.exists():
        if time.monotonic() > until or _scratch_gone():
            print("KERNELAGENT_NCU_ABANDONED", flush=True)
            _exit_fast(3)
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


def _scratch_gone() -> bool:
    try:
        return os.stat(".").st_nlink == 0
    except OSError:
        return True


if __name__ == "__main__":
    _exit_done(main(sys.argv[1:]))
