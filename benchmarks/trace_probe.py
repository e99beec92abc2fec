"""Issue 55's first device probe of the kernel tracer (kernelagent/harness/trace): does the CUPTI
injection library build and load on the device, what does its trace hold, what does it cost, and
what do the hostile basics look like in it.

    python3 benchmarks/trace_probe.py --out DIR [--pairs 4] [--calls 200]

Steps (each in fresh child processes of this one, the pipe made here, as the server will):
  build     the tracer, cold (a fresh cache) and warm;
  honest    torch + a Triton relu + a torch matmul: a first call, 2 checks, 2 warm-ups and
            5 timed calls, each bracketed by markers, then the final flush;
  timing    the same kernels timed with CUDA events (markers outside the events) in traced and
            untraced processes, alternating: per-kernel medians, the start-up (import torch,
            CUDA's initialisation, where the injection happens, the first kernel, the first
            Triton call);
  hostile   cuptiActivityDisable / cuptiFinalize through ctypes around torch work in a timed
            call; CUDA_INJECTION64_PATH cleared after CUDA's start and before it; a grandchild
            process that launches the kernels; forged lines written into the channel; what a
            candidate can see of the tracer.
Writes DIR/summary.json and DIR/traces.tar.gz (every trace as JSON lines, for CPU fixtures).
Needs a GPU; the children run this same file with `child MODE`."""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TRACE = REPO / "kernelagent" / "harness" / "trace"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# ======================================================================================
# The child: runs in the traced (or untraced) process
# ======================================================================================

def child(mode: str, calls: int) -> None:
    t0 = time.perf_counter()
    row: dict = {"mode": mode, "pid": os.getpid()}
    if mode == "clearenv_before":
        os.environ.pop("CUDA_INJECTION64_PATH", None)
    import torch
    import triton
    import triton.language as tl
    row["import_s"] = time.perf_counter() - t0
    marks_mod = _load(TRACE / "marks.py", "ka_marks")

    @triton.jit
    def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m, other=0.0)
        tl.store(y_ptr + offs, tl.where(x > 0, x, 0.0), mask=m)

    def relu(x, y):
        relu_kernel[(triton.cdiv(x.numel(), 4096),)](x, y, x.numel(), BLOCK=4096, num_warps=8)
        return y

    t = time.perf_counter()
    torch.cuda.init()
    row["cuda_init_s"] = time.perf_counter() - t
    if mode == "clearenv_after":
        os.environ.pop("CUDA_INJECTION64_PATH", None)
        os.environ.pop("KERNELAGENT_TRACE_FD", None)
    t = time.perf_counter()
    torch.ones(1, device="cuda").mul_(2)
    torch.cuda.synchronize()
    row["first_kernel_s"] = time.perf_counter() - t
    row["start_to_first_kernel_s"] = time.perf_counter() - t0
    marks = marks_mod.attach()
    row["marks"] = marks.available or marks.reason
    row["env_after_init"] = {k: os.environ.get(k) for k in ("CUDA_INJECTION64_PATH", "KERNELAGENT_TRACE_FD")}
    maps = Path("/proc/self/maps").read_text()
    row["visible"] = sorted({line.split()[-1].rsplit("/", 1)[-1] for line in maps.splitlines()
                             if "cupti" in line or "kernelagent_trace" in line})
    stream = torch.cuda.current_stream().cuda_stream

    small_x = torch.randn(1 << 22, device="cuda")      # 16 MiB: ~10 us
    small_y = torch.empty_like(small_x)
    big_x = torch.randn(1 << 26, device="cuda")        # 256 MiB: ~120 us
    big_y = torch.empty_like(big_x)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def work():
        relu(small_x, small_y)
        torch.mm(a, b)

    t = time.perf_counter()
    relu(small_x, small_y)
    torch.cuda.synchronize()
    row["first_triton_call_s"] = time.perf_counter() - t

    def bracket(phase, index, fn, events=None):
        marks.mark(stream=stream, phase=phase, index=index, end=False)
        if events:
            events[0].record()
        fn()
        if events:
            events[1].record()
        marks.mark(stream=stream, phase=phase, index=index, end=True)

    if mode == "timing":
        kernels = {"relu_16MiB": lambda: relu(small_x, small_y), "relu_256MiB": lambda: relu(big_x, big_y),
                   "mm_4096_bf16": lambda: torch.mm(a, b)}
        row["median_us"] = {}
        for name, fn in kernels.items():
            for _ in range(10):
                fn()
            pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
            for i, ev in enumerate(pairs):
                bracket(3, i, fn, ev)
            torch.cuda.synchronize()
            row["median_us"][name] = statistics.median(s.elapsed_time(e) * 1e3 for s, e in pairs)
        # A burst: 5000 tiny launches with no wait, then one flush (does the channel keep up?).
        one = torch.zeros(1, device="cuda")
        t = time.perf_counter()
        for _ in range(5000):
            one.add_(1)
        torch.cuda.synchronize()
        row["burst_5000_s"] = time.perf_counter() - t
        t = time.perf_counter()
        row["flush"] = marks.flush(mark=1, final=True)
        row["flush_s"] = time.perf_counter() - t
        row["counts"] = marks.counts()
        print("ROW " + json.dumps(row), flush=True)
        return

    print("ROW " + json.dumps(row), flush=True)  # kept if a hostile step below kills the process
    # The honest shape: first call, 2 checks, 2 warm-ups, 5 timed calls.
    bracket(1, 0, work)
    torch.cuda.synchronize()
    marks.flush(mark=1, final=False)
    for i in range(2):
        bracket(2, i, work)
    torch.cuda.synchronize()
    for i in range(2):
        bracket(4, i, work)
    cupti = None
    if mode in ("disable", "finalize"):
        path = next(line.split()[-1] for line in maps.splitlines() if "libcupti" in line)
        cupti = ctypes.CDLL(path)
        row["cupti_path"] = path
    for i in range(5):
        ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        if i == 2 and mode == "disable":
            row["disable_rc"] = [cupti.cuptiActivityDisable(10), cupti.cuptiActivityDisable(3)]
            bracket(3, i, work, ev)
            torch.cuda.synchronize()
            row["enable_rc"] = cupti.cuptiActivityEnable(10)
        elif i == 2 and mode == "finalize":
            torch.cuda.synchronize()
            row["finalize_rc"] = cupti.cuptiFinalize()
            bracket(3, i, work, ev)
        elif i == 2 and mode == "grandchild":
            marks.mark(stream=stream, phase=3, index=i, end=False)
            ev[0].record()
            r = subprocess.run([sys.executable, "-c", "import torch; x=torch.ones(1<<20,device='cuda');"
                                "(x*2).sum().item(); print('gc ok')"], capture_output=True, text=True, timeout=120)
            row["grandchild"] = (r.returncode, r.stdout.strip()[-200:], r.stderr.strip()[-300:])
            ev[1].record()
            marks.mark(stream=stream, phase=3, index=i, end=True)
        else:
            bracket(3, i, work, ev)
    torch.cuda.synchronize()
    row["copy_back"] = small_y[:16].cpu().sum().item() >= 0  # a device-to-host memcpy record
    if mode == "forge":
        fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
        pipes = []
        for f in fds:
            try:
                if f > 2 and os.readlink(f"/proc/self/fd/{f}").startswith("pipe:"):
                    pipes.append(f)
            except OSError:
                continue
        row["pipes_seen"] = pipes
        forged = (b'{"seq":3,"t":"kernel","name":"forged","corr":1,"ctx":1,"dev":0,"stream":7,'
                  b'"grid":[1,1,1],"block":[1,1,1],"start":1,"end":2,"graph":0}\n')
        row["forged_writes"] = []
        for f in pipes:
            try:
                row["forged_writes"].append((f, os.write(f, forged)))
            except OSError as exc:
                row["forged_writes"].append((f, str(exc)))
    row["flush"] = marks.flush(mark=2, final=True)
    row["counts"] = marks.counts()
    row["mark_errors"] = marks.errors
    print("ROW " + json.dumps(row), flush=True)


# ======================================================================================
# The parent: the server's side of the channel
# ======================================================================================

def run_child(mode: str, lib: Path | None, calls: int, timeout: float = 180.0) -> tuple[dict, bytes, dict]:
    env = dict(os.environ)
    env.pop("CUDA_INJECTION64_PATH", None)
    env.pop("KERNELAGENT_TRACE_FD", None)
    rfd = wfd = None
    chunks: list[bytes] = []
    reader = None
    if lib is not None:
        rfd, wfd = os.pipe()
        env["CUDA_INJECTION64_PATH"] = str(lib)
        env["KERNELAGENT_TRACE_FD"] = str(wfd)

        def read() -> None:
            while True:
                data = os.read(rfd, 1 << 16)
                if not data:
                    return
                chunks.append(data)
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "child", mode, "--calls", str(calls)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            pass_fds=(wfd,) if wfd is not None else ())
    if wfd is not None:
        os.close(wfd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    wall = time.perf_counter() - t
    if reader is not None:
        reader.join(timeout=10)
        os.close(rfd)
    row = {}
    for line in out.splitlines():
        if line.startswith("ROW "):
            row = json.loads(line[4:])
    row.update(rc=proc.returncode, wall_s=round(wall, 3))
    if proc.returncode:
        row["stderr_tail"] = err[-1500:]
    raw = b"".join(chunks)
    return row, raw, summarise(raw)


def summarise(raw: bytes) -> dict:
    recs, bad = [], 0
    for line in raw.splitlines():
        try:
            recs.append(json.loads(line))
        except ValueError:
            bad += 1
    types = Counter(r.get("t") for r in recs)
    seqs = [r.get("seq") for r in recs]
    kernels = [r for r in recs if r.get("t") == "kernel"]
    markers = sorted((r for r in kernels if r["name"] == "kernelagent_trace_marker"), key=lambda r: r["start"])
    begins = {}
    calls = []
    for m in markers:
        gx, gy, gz = m["grid"]
        if gz == 1:
            begins[(gy, gx - 1)] = m
        elif (gy, gx - 1) in begins:
            b = begins.pop((gy, gx - 1))
            inside = [k for k in kernels if k["name"] != "kernelagent_trace_marker"
                      and k["start"] >= b["end"] and k["end"] <= m["start"]]
            calls.append({"phase": gy, "index": gx - 1, "kernels": len(inside),
                          "names": sorted({k["name"][:40] for k in inside}),
                          "busy_us": round(sum(k["end"] - k["start"] for k in inside) / 1e3, 1)})
    return {
        "lines": len(recs), "bad_lines": bad, "bytes": len(raw), "types": dict(types),
        "seq_ok": seqs == list(range(len(seqs))),
        "hello": bool(recs) and recs[0].get("t") == "hello",
        "final_flush": bool(recs) and recs[-1].get("t") == "flush" and recs[-1].get("final") == 1,
        "dropped": sum(r.get("n", 0) for r in recs if r.get("t") == "dropped"),
        "markers": [(m["grid"][1], m["grid"][0] - 1, m["grid"][2]) for m in markers],
        "marker_streams": sorted({m["stream"] for m in markers}), "marker_ctx": sorted({m["ctx"] for m in markers}),
        "kernel_streams": dict(Counter(k["stream"] for k in kernels)),
        "unpaired_begins": sorted(begins), "calls": calls,
        "max_line": max((len(line) for line in raw.splitlines()), default=0),
    }


def parent(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S")}
    traces: dict[str, bytes] = {}

    def save() -> None:
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for name, data in traces.items():
                info = tarfile.TarInfo(f"traces/{name}.jsonl")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        (out / "traces.tar.gz").write_bytes(buf.getvalue())

    build = _load(TRACE / "build.py", "ka_trace_build")
    cache = Path(tempfile.mkdtemp(prefix="trace-cache-"))
    summary["toolchain"] = str(build.find_toolchain())
    t = time.perf_counter()
    lib = build.library(cache_dir=cache)
    summary["build_cold_s"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    build.library(cache_dir=cache)
    summary["build_warm_s"] = round(time.perf_counter() - t, 4)
    if not isinstance(lib, Path):  # a second try on Triton's bundled CUPTI alone (its headers match it)
        summary["first_try"] = str(lib)
        import triton
        alone = Path(tempfile.mkdtemp(prefix="triton-only-"))
        (alone / "triton").symlink_to(Path(triton.__file__).parent)
        t = time.perf_counter()
        lib = build.library(cache_dir=cache, roots=[alone], env={"CUDA_HOME": str(alone / "none")})
        summary["build_triton_bundle_s"] = round(time.perf_counter() - t, 3)
        summary["toolchain"] = str(build.find_toolchain(roots=[alone], env={"CUDA_HOME": str(alone / "none")}))
    summary["library"] = str(lib)
    print("build:", json.dumps({k: summary[k] for k in ("toolchain", "build_cold_s", "build_warm_s", "library")}), flush=True)
    save()
    if not isinstance(lib, Path):
        return 1

    row, raw, s = run_child("honest", lib, args.calls)
    traces["honest"] = raw
    summary["honest"] = {"child": row, "trace": s}
    print("honest:", json.dumps(summary["honest"], default=str)[:6000], flush=True)
    save()

    pairs = []
    for i in range(args.pairs):
        order = ("traced", "untraced") if i % 2 == 0 else ("untraced", "traced")
        pair = {}
        for which in order:
            row, raw, s = run_child("timing", lib if which == "traced" else None, args.calls)
            pair[which] = {k: row.get(k) for k in ("median_us", "import_s", "cuda_init_s", "first_kernel_s",
                                                   "start_to_first_kernel_s", "first_triton_call_s", "flush_s", "burst_5000_s",
                                                   "counts", "rc", "wall_s", "stderr_tail")}
            if which == "traced":
                pair[which]["trace"] = {k: s[k] for k in ("lines", "bytes", "types", "seq_ok", "dropped", "final_flush")}
        pairs.append(pair)
        print(f"timing pair {i}:", json.dumps(pair, default=str)[:3000], flush=True)
    summary["timing_pairs"] = pairs
    agg = {}
    for key in ("cuda_init_s", "first_kernel_s", "start_to_first_kernel_s", "first_triton_call_s", "import_s",
                "burst_5000_s", "wall_s"):
        tr = [p["traced"][key] for p in pairs if p["traced"].get(key) is not None]
        un = [p["untraced"][key] for p in pairs if p["untraced"].get(key) is not None]
        if tr and un:
            agg[key] = {"traced_median": statistics.median(tr), "untraced_median": statistics.median(un)}
    for name in ("relu_16MiB", "relu_256MiB", "mm_4096_bf16"):
        diffs = [(p["traced"]["median_us"][name] / p["untraced"]["median_us"][name] - 1) * 100
                 for p in pairs if p["traced"].get("median_us") and p["untraced"].get("median_us")]
        tr = [p["traced"]["median_us"][name] for p in pairs if p["traced"].get("median_us")]
        un = [p["untraced"]["median_us"][name] for p in pairs if p["untraced"].get("median_us")]
        if diffs:
            agg[name] = {"traced_us": statistics.median(tr), "untraced_us": statistics.median(un),
                         "median_diff_pct": statistics.median(diffs), "diffs_pct": [round(d, 2) for d in diffs]}
    summary["timing"] = agg
    print("timing:", json.dumps(agg, indent=1), flush=True)
    save()

    for mode in ("disable", "finalize", "clearenv_after", "clearenv_before", "grandchild", "forge"):
        row, raw, s = run_child(mode, lib, args.calls, timeout=90.0)
        traces[mode] = raw
        summary[mode] = {"child": row, "trace": s}
        print(f"{mode}:", json.dumps(summary[mode], default=str)[:4000], flush=True)
        save()
    summary["ended"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="parent")
    parser.add_argument("mode", nargs="?", default="")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/trace_probe"))
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    if args.role == "child":
        child(args.mode, args.calls)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
