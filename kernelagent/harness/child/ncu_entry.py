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


def main(argv: list[str]) -> int:
    problem_path, candidate_path, backend, calls = argv[0], argv[1], argv[2], int(argv[3])
    import torch

    from kernelagent.harness.child import defences, inputs as inputs_mod
    from kernelagent.harness.child.common import clean_numeric_modes
    from kernelagent.harness.config import EvalConfig

    config = EvalConfig(backend=backend)
    device = torch.device("cuda:0")
    torch.cuda.set_device(device)
    clean_numeric_modes()
    torch.empty(1, device=device)
    problem = inputs_mod.import_file(Path(problem_path), "kernelagent_problem")
    sys.modules.pop("kernelagent_problem", None)
    scratch = Path(os.getcwd())
    builder = None
    if backend == "cuda":
        from kernelagent.harness.child import cuda_build

        capability = "%d.%d" % torch.cuda.get_device_capability(device)
        os.environ["TORCH_CUDA_ARCH_LIST"] = capability
        builder = cuda_build.BuildHook(scratch, scratch / ".ka-build-cache",
                                       os.environ.get("KERNELAGENT_CANDIDATE_SHA", "unknown"), capability)
        builder.install()
    monitor = defences.Monitor(Path(candidate_path), scratch, config, builder=builder)
    monitor.install()
    _wait_for_the_device()  # from here on the candidate's code runs
    module = inputs_mod.import_file(Path(candidate_path), "candidate")
    init = inputs_mod.init_inputs(problem, False, device, config.weight_seed)
    model = inputs_mod.build_model(module.ModelNew, init, device, config.weight_seed)
    values = inputs_mod.make_inputs(problem, "main", 0, False, device)
    with torch.no_grad():
        for _ in range(3):  # compile, autotune and warm up outside the profiled range
            model(*values)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for _ in range(calls):
            model(*values)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    print("KERNELAGENT_NCU_DONE " + json.dumps(dict(monitor.state.violations)), flush=True)
    return 0


GO_FILE = "kernelagent-go"


def _wait_for_the_device() -> None:
    """Under the harness server (KERNELAGENT_NCU_HANDSHAKE), the candidate's code waits for the
    device's timing slot: our own set-up (torch, the CUDA context, the problem) is done, so say
    READY, then wait until the server, holding the slot with every other job stopped and the
    device idle, creates GO_FILE in the scratch. Elsewhere (`kernelagent profile`) nothing waits.
    Nothing of the candidate's has run before this point."""
    if not os.environ.get("KERNELAGENT_NCU_HANDSHAKE"):
        return
    import time

    print("KERNELAGENT_NCU_READY", flush=True)
    go = Path(os.getcwd()) / GO_FILE
    pause = 0.001
    while not go.exists():
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
