"""Why a kernel is slow, in a few lines a model can act on: `kernelagent profile` and the
agent's `profile` tool.

Three sources, each optional:
1. torch.profiler (the harness's `EvalConfig(profile=True)` run, in the candidate's own
   sandboxed process): the kernels launched, with time, launches per call and share of the
   device time, and which of them are the candidate's own.
2. A roofline from the problem's workload (input + output + parameter bytes, and FLOPs from
   `get_flops()` when the problem has it) against the device's peaks (kernelagent/hardware.py):
   achieved bandwidth and FLOP/s as fractions of peak, and which roof binds.
3. Nsight Compute, where `ncu` exists and there is a GPU: a separate small process imports the
   candidate (with the same audit hook as in the harness, and only once the harness has found
   the candidate correct and not flagged), runs a few forward calls between
   cudaProfilerStart/Stop, and ncu collects a handful of metrics for the top kernels only
   (`--kernel-name`, `--launch-count`, time-boxed): DRAM and SM throughput as % of peak,
   achieved and theoretical occupancy, the occupancy limiter, registers per thread, shared
   memory per block, and the top warp stall reasons.

Without a GPU or without ncu, the report says what it could not measure and why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernelagent import hardware
# Nsight Compute itself lives in server/ncu.py; these names stay importable from here.
from kernelagent.harness.server.ncu import (NCU_METRICS, NCU_STALLS, UNSANDBOXED_NCU, find_ncu,  # noqa: F401
                                            ncu_sandbox, parse_ncu_csv, run_ncu, summarise_ncu)

if TYPE_CHECKING:
    from kernelagent.harness.result import EvalResult
    from kernelagent.problem import Problem
    from pathlib import Path

# --------------------------------------------------------------------------------------
# Roofline from an EvalResult
# --------------------------------------------------------------------------------------

def roofline(result: EvalResult, fingerprint: dict[str, Any] | None = None) -> dict[str, Any]:
    """Roofline fractions for the candidate's median time, or {"unavailable": why}."""
    fingerprint = fingerprint if fingerprint is not None else result.fingerprint
    device = hardware.describe_device(fingerprint or {})
    timing = result.timings.get("candidate")
    work = result.workload or {}
    if device.get("kind") != "cuda":
        return {"unavailable": "no GPU: achieved bandwidth and FLOP/s cannot be measured on the CPU "
                               "(interpreter timings are not meaningful)"}
    if timing is None or not timing.meaningful:
        return {"unavailable": "the candidate was not timed"}
    if not work.get("output_bytes") and not work.get("input_bytes"):
        return {"unavailable": "the problem's workload (bytes) is unknown"}
    nbytes = float((work.get("input_bytes") or 0) + (work.get("output_bytes") or 0) + (work.get("param_bytes") or 0))
    out = hardware.roofline_fractions(device, nbytes, work.get("flops"), str(work.get("dtype") or "float32"),
                                      timing.median_ms)
    out["device"] = device.get("name")
    if out.get("peak_gbs") is None:
        out["note"] = f"no datasheet peaks for {device.get('name')}: fractions unknown"
    return out


# --------------------------------------------------------------------------------------
# The few lines
# --------------------------------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:.0f}%"


def _stall_words(reason: str) -> str:
    return {"long_scoreboard": "long scoreboard (waiting on global/local memory)",
            "short_scoreboard": "short scoreboard (shared memory / MUFU)",
            "mio_throttle": "MIO throttle (shared-memory instruction queue)",
            "lg_throttle": "LG throttle (too many global memory instructions)",
            "barrier": "barrier (__syncthreads)", "math_pipe_throttle": "math pipe throttle",
            "wait": "fixed-latency wait", "not_selected": "not selected (enough eligible warps)",
            "membar": "memory barrier", "tex_throttle": "texture throttle", "dispatch_stall": "dispatch stall",
            "no_instruction": "no instruction (instruction cache)", "branch_resolving": "branch resolving",
            "drain": "drain (stores at exit)", "imc_miss": "constant cache miss",
            "sleeping": "sleeping", "selected": "selected (issuing)"}.get(reason, reason.replace("_", " "))


AGREEMENT_PCT = 3.0  # issue 13: the harness median and the profiler's kernel sum agree within 3% ...
AGREEMENT_MIN_MS = 0.05  # ... for kernels of 50 us or more


def clocks(result: EvalResult) -> dict[str, Any]:
    """The two clocks of one evaluation, per forward call: the harness's median (the timed loop:
    L2 flushed before each call, synchronised, host time included) and the device time of every
    kernel the profiler saw, summed (torch.profiler in the candidate's process: the median of 5
    calls on the main inputs right after the timed loop; child/kernel_profile.py). Their
    difference is the host overhead per call (launches, Python, synchronisation), plus what the
    L2 flush costs the harness's calls (the profiled calls run without a flush).

    {"harness_ms", "profiler_ms", "host_overhead_ms", "diff_pct", "within_pct" (True/False, or
    None under 50 us where no target applies), "meaningful", "kernels", "note"}; {"unavailable":
    why} when either clock is missing."""
    timing = result.timings.get("candidate") if getattr(result, "timings", None) else None
    kernels = list(getattr(result, "kernels", None) or [])
    if timing is None:
        return {"unavailable": "the candidate was not timed"}
    if not kernels:
        return {"unavailable": "the profiler reported no kernels (ask for profiling: EvalConfig(profile=True))"}
    device = all(k.get("kind", "device") == "device" for k in kernels)
    # profile_kernels keeps the top 10 rows, each with its share of ALL the profiled time: the
    # total is any row's time over its share (exact for every row), so rows cut off still count.
    shared = [k for k in kernels if (k.get("share") or 0) > 0 and (k.get("total_ms") or 0) > 0]
    profiler_ms = (shared[0]["total_ms"] / shared[0]["share"]) if shared else \
        sum(float(k.get("total_ms") or 0.0) for k in kernels)
    harness_ms = float(timing.median_ms)
    meaningful = bool(timing.meaningful) and device
    out: dict[str, Any] = {
        "harness_ms": harness_ms, "harness_source": getattr(timing, "source", "in-process"),
        "profiler_ms": profiler_ms, "host_overhead_ms": harness_ms - profiler_ms,
        "diff_pct": 100.0 * (harness_ms - profiler_ms) / profiler_ms if profiler_ms > 0 else None,
        "kernels": len(kernels), "kind": "device" if device else "cpu", "meaningful": meaningful,
    }
    if meaningful and out["diff_pct"] is not None and profiler_ms >= AGREEMENT_MIN_MS:
        out["within_pct"] = abs(out["diff_pct"]) <= AGREEMENT_PCT
    else:
        out["within_pct"] = None
    if not meaningful:
        out["note"] = ("not meaningful: no GPU (the profiler's rows are CPU ops and the times are the Triton "
                       "interpreter's)" if not device else "not meaningful: the harness timing is not meaningful here")
    elif profiler_ms < AGREEMENT_MIN_MS:
        out["note"] = f"under {AGREEMENT_MIN_MS * 1e3:.0f} us of device time: no agreement target applies"
    return out


def clock_line(c: dict[str, Any]) -> str:
    """One line with both clocks and the host overhead apart."""
    if "unavailable" in c:
        return f"clocks: {c['unavailable']}"
    what = "device kernels" if c.get("kind") == "device" else "CPU ops"
    diff = "" if c.get("diff_pct") is None else f" ({c['diff_pct']:+.1f}% of the profiler's)"
    agree = {True: f"; within {AGREEMENT_PCT:g}%", False: f"; NOT within {AGREEMENT_PCT:g}%", None: ""}[
        c.get("within_pct")]
    return (f"clocks: harness {c['harness_ms']:.4f} ms/call median ({c.get('harness_source', 'in-process')}); "
            f"profiler {what} {c['profiler_ms']:.4f} ms/call; host overhead {c['host_overhead_ms']:.4f} ms/call"
            f"{diff}{agree}" + (f" [{c['note']}]" if c.get("note") else ""))


def summary_lines(result: EvalResult, roof: dict[str, Any], ncu: dict[str, Any] | None) -> list[str]:
    """The report in a few lines a model can act on."""
    lines: list[str] = []
    timing = result.timings.get("candidate")
    cpu = not (result.fingerprint or {}).get("cuda")
    if timing is not None:
        base = [f"{n if n != 'compile' else 'TorchInductor'} {t.median_ms:.4f} ms" for n, t in result.timings.items()
                if n != "candidate"]
        speed = [f"{v:.2f}x vs {'TorchInductor' if n == 'compile' else n}" for n, v in result.speedups.items()]
        lines.append(f"time: candidate {timing.median_ms:.4f} ms median" + (f" ({', '.join(base)})" if base else "")
                     + (f"; {', '.join(speed)}" if speed else "")
                     + (" [CPU/interpreter: not meaningful]" if not timing.meaningful else ""))
    if result.kernels:
        what = "CPU ops (no GPU)" if cpu else "kernels"
        parts = [f"{k['name'][:70]} {_pct(k.get('share'))} ({k.get('calls', '?')}x/call"
                 + (", own" if k.get("own") else "") + ")" for k in result.kernels[:3]]
        lines.append(f"top {what}: " + "; ".join(parts))
        if not cpu and result.kernels and not result.kernels[0].get("own"):
            lines.append(f"note: the top kernel ({result.kernels[0]['name'][:60]}) is not one of your own kernels")
        if timing is not None:
            lines.append(clock_line(clocks(result)))
    if "unavailable" in roof:
        lines.append(f"roofline: {roof['unavailable']}")
    else:
        bw, comp = roof.get("bandwidth_fraction"), roof.get("compute_fraction")
        achieved = f"{roof['achieved_gbs']:.0f} GB/s"
        if roof.get("bound") == "compute" and comp is not None:
            lines.append(f"compute-bound at {_pct(comp)} of peak {roof['dtype']} FLOP/s "
                         f"({roof['achieved_tflops']:.1f} of {roof['peak_tflops']:.0f} TFLOP/s; memory {_pct(bw)} of "
                         f"peak bandwidth)")
        elif bw is not None:
            lines.append(f"memory-bound at {_pct(bw)} of peak DRAM bandwidth ({achieved} of "
                         f"{roof['peak_gbs']:.0f} GB/s, counting {roof['bytes'] / 1e6:.1f} MB per call)"
                         + (f"; compute {_pct(comp)} of peak" if comp is not None else ""))
        else:
            lines.append(f"roofline: achieved {achieved}; {roof.get('note', 'peaks unknown')}")
        if roof.get("roofline_fraction") is not None:
            lines.append(f"roofline: {_pct(roof['roofline_fraction'])} of the speed the roofline allows "
                         f"(floor {roof['floor_ms']:.4f} ms)")
    if ncu is None:
        pass
    elif "unavailable" in ncu:
        lines.append(f"ncu: not measured: {ncu['unavailable']}")
    else:
        for k in ncu.get("kernels", [])[:2]:
            parts = [f"DRAM {k['dram_pct']:.0f}% of peak" if k.get("dram_pct") is not None else None,
                     f"SM {k['sm_pct']:.0f}%" if k.get("sm_pct") is not None else None]
            occ = k.get("achieved_occupancy_pct")
            if occ is not None:
                theo = k.get("theoretical_occupancy_pct")
                parts.append(f"occupancy {occ:.0f}%" + (f" (theoretical {theo:.0f}%)" if theo is not None else ""))
            if k.get("registers_per_thread") is not None:
                parts.append(f"{k['registers_per_thread']:.0f} regs/thread")
            parts.append(f"{(k.get('smem_per_block') or 0) / 1024:.1f} KiB smem/block")
            if k.get("block_size"):
                parts.append(f"block {k['block_size']:.0f}, grid {k.get('grid_size') or 0:.0f}")
            lines.append(f"ncu {k['base_name'][:50]}: " + ", ".join(p for p in parts if p))
            limiter = k.get("occupancy_limiter")
            theo = k.get("theoretical_occupancy_pct")
            if limiter and theo is not None and theo < 99:
                detail = {"registers": f"registers ({k.get('registers_per_thread') or 0:.0f}/thread)",
                          "shared_mem": f"shared memory ({(k.get('smem_per_block') or 0) / 1024:.1f} KiB/block)",
                          "blocks": "the blocks-per-SM limit (blocks too small)",
                          "warps": "warps per SM (block size)"}[limiter]
                lines.append(f"  occupancy limited by {detail}")
            if k.get("top_stalls"):
                lines.append("  top stalls: " + ", ".join(f"{_stall_words(s['reason'])} {s['share']:.0%}"
                                                          for s in k["top_stalls"]))
    lines += advice(roof, ncu)
    return lines


def advice(roof: dict[str, Any], ncu: dict[str, Any] | None) -> list[str]:
    """One or two hints that follow from the numbers (never more)."""
    hints = []
    bw = roof.get("bandwidth_fraction")
    if roof.get("bound") == "memory" and bw is not None and bw < 0.6:
        hints.append("hint: memory-bound well below peak bandwidth: coalesce and vectorise loads/stores "
                     "(128-bit), avoid re-reading inputs, fuse passes, and launch enough blocks to fill every SM")
    comp = roof.get("compute_fraction")
    if roof.get("bound") == "compute" and comp is not None and comp < 0.5:
        hints.append("hint: compute-bound well below peak: use tensor cores (tl.dot / mma) where the dtype allows, "
                     "tile for data reuse in shared memory/registers")
    if ncu and ncu.get("kernels"):
        k = ncu["kernels"][0]
        stalls = [s["reason"] for s in k.get("top_stalls", [])]
        if stalls and stalls[0] == "long_scoreboard" and (k.get("achieved_occupancy_pct") or 100) < 50:
            hints.append("hint: warps wait on memory with low occupancy: raise occupancy (fewer registers, smaller "
                         "shared-memory tiles) or add memory-level parallelism per thread")
        elif stalls and stalls[0] == "barrier":
            hints.append("hint: warps wait at barriers: use warp-level reductions (shuffles) instead of "
                         "__syncthreads-heavy block reductions")
    return hints[:2]


def profile(problem: Problem | str | Path, candidate_source: str, *, evaluator: Any = None, device: str = "auto",
            backend: str = "triton", trials: int = 2, use_ncu: bool | str = "auto", ncu_timeout: float = 180.0,
            baselines: bool = True, config_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Evaluate with profiling, then the roofline and (where possible) ncu. Returns
    {"result": EvalResult, "roofline": {...}, "ncu": {...} | None, "lines": [...]}."""
    from contextlib import ExitStack

    from kernelagent.harness import EvalConfig, Evaluator, Status
    from kernelagent.problem import load_problem

    if not hasattr(problem, "source"):
        problem = load_problem(problem)
    with ExitStack() as stack:
        if evaluator is None:
            evaluator = stack.enter_context(Evaluator(device=device))
        # No kernel evidence here: the profile runs ncu itself, for its metrics, right after.
        config = EvalConfig(**{"kernel_evidence": False, **(config_overrides or {}), "trials": trials,
                               "timing": True, "baselines": baselines,
                               "profile": True, "backend": backend})
        result = evaluator.evaluate(problem, candidate_source, config)
        fingerprint = result.fingerprint or evaluator.fingerprint()
        roof = roofline(result, fingerprint)
        ncu: dict[str, Any] | None
        if use_ncu is False:
            ncu = None
        elif not fingerprint.get("cuda"):
            ncu = {"unavailable": "no GPU: Nsight Compute metrics (DRAM/SM throughput, occupancy, registers, "
                                  "shared memory, stalls) need one"}
        elif result.status != Status.CORRECT or not result.passed:
            ncu = {"unavailable": f"skipped: the candidate is {result.status}"
                                  + ("" if result.status != Status.CORRECT else " but flagged")
                                  + " (ncu runs only correct, unflagged candidates)"}
        else:
            names = [k["name"] for k in result.kernels if k.get("own")][:3] or [k["name"] for k in result.kernels[:2]]
            from kernelagent.harness.cuda_source import kernel_base_name

            dev = getattr(evaluator, "visible_devices", None)
            ncu = run_ncu(problem.path, candidate_source, backend=backend, allow_unsandboxed=use_ncu is True,
                          device=f"cuda:{dev}" if dev is not None else "cuda:0",
                          kernel_names=sorted({kernel_base_name(n) for n in names}), timeout=ncu_timeout,
                          cache_dir=getattr(evaluator, "cuda_cache_dir", None), candidate_sha=result.candidate_sha256)
    lines = summary_lines(result, roof, ncu)
    return {"result": result, "roofline": roof, "ncu": ncu, "lines": lines, "clocks": clocks(result)}
