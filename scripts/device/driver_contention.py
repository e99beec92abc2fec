"""Issue 59: is a job slower beside a second GPU's server because the two share the CUDA driver?

Starts N processes at once on GPU 0 alone, then N on GPU 0 beside N on GPU 1, each process doing
what every job's two processes do with the driver: create a CUDA context, then a loop of device
allocations freed back to the driver and CUDA IPC handles exported and opened by a partner
(the candidate's outputs reach the reference by IPC). It prints, per phase, the median and the
largest context-creation time and loop time of GPU 0's processes. A host-wide driver lock shows
as GPU 0's times rising when GPU 1 is busy too.
    python3 scripts/device/driver_contention.py [--procs 8] [--iters 100] [--mib 64]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time


RAW = [False]


def worker(device: int, iters: int, mib: int, barrier, out, visible: bool) -> None:
    import os

    if visible:  # as the harness's servers are started: their one GPU only
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device)
    import torch

    index = 0 if visible else device

    barrier.wait()
    t0 = time.perf_counter()
    torch.cuda.set_device(index)
    torch.zeros(1, device=f"cuda:{index}")
    torch.cuda.synchronize()
    ctx_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    for _ in range(iters):
        x = torch.empty(mib << 20, dtype=torch.uint8, device=f"cuda:{index}")
        handle = x.untyped_storage()._share_cuda_()  # the IPC export a transfer makes
        del x, handle
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # back to the driver: a cudaFree, as a job's end does
    loop_s = time.perf_counter() - t1
    out.put(json.dumps({"device": device, "ctx_s": ctx_s, "loop_s": loop_s}))


def raw_worker(device: int, iters: int, mib: int, barrier, out, visible: bool) -> None:
    """The driver API alone (libcuda through ctypes, no torch): cuInit and the primary context,
    the same allocation loop without IPC, and the context's release (its teardown) timed too."""
    import ctypes
    import os

    if visible:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device)
    cuda = ctypes.CDLL("libcuda.so.1")
    index = 0 if visible else device
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    barrier.wait()
    t0 = time.perf_counter()
    assert cuda.cuInit(0) == 0
    assert cuda.cuDeviceGet(ctypes.byref(dev), index) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    assert cuda.cuCtxSynchronize() == 0
    ctx_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    for _ in range(iters):
        assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib << 20)) == 0
        assert cuda.cuMemFree_v2(ptr) == 0
    loop_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    assert cuda.cuDevicePrimaryCtxRelease_v2(dev) == 0
    out.put(json.dumps({"device": device, "ctx_s": ctx_s, "loop_s": loop_s, "release_s": time.perf_counter() - t2}))


def phase(devices: list[int], procs: int, iters: int, mib: int, visible: bool) -> dict:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs * len(devices))
    out = ctx.Queue()
    target = raw_worker if RAW[0] else worker
    ps = [ctx.Process(target=target, args=(d, iters, mib, barrier, out, visible))
          for d in devices for _ in range(procs)]
    for p in ps:
        p.start()
    rows = [json.loads(out.get(timeout=300)) for _ in ps]
    for p in ps:
        p.join(60)
    zero = [r for r in rows if r["device"] == 0]
    return {k: {"median": round(statistics.median(r[k] for r in zero), 3), "max": round(max(r[k] for r in zero), 3)}
            for k in ("ctx_s", "loop_s", "release_s") if k in zero[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--visible", action="store_true",
                        help="each process sees its one GPU only (CUDA_VISIBLE_DEVICES), as a server's jobs do")
    parser.add_argument("--raw", action="store_true",
                        help="the driver API through ctypes (no torch), the context's release timed too")
    args = parser.parse_args()
    RAW[0] = args.raw
    print("one process on GPU 0", json.dumps(phase([0], 1, args.iters, args.mib, args.visible)), flush=True)
    for name, devices in (("GPU 0 alone", [0]), ("GPU 0 beside GPU 1", [0, 1]), ("GPU 0 alone again", [0])):
        summary = phase(devices, args.procs, args.iters, args.mib, args.visible)
        print(f"{args.procs} per GPU, {name}", json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
