"""The profile tool without a GPU: it degrades with a clear message and still reports what
it can (CPU ops, interpreter timing). Plus the roofline and ncu parsing on fixed data."""

from __future__ import annotations

import pytest

import json

from kernelagent import hardware
from kernelagent.harness.caller import profiling
from tests.conftest import BENCHMARKS

SOFTMAX = BENCHMARKS / "level1" / "5_softmax.py"
SOFTMAX_SOL = BENCHMARKS / "solutions" / "level1" / "5_softmax.py"


def test_profile_cli_on_cpu_degrades_clearly(tmp_path):
    from typer.testing import CliRunner

    from kernelagent.cli import app

    out = CliRunner().invoke(app, ["profile", str(SOFTMAX), str(SOFTMAX_SOL), "--device", "cpu", "--json",
                                   "--cache-dir", str(tmp_path), "--no-baselines"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output.strip().splitlines()[-1])
    assert data["status"] == "correct" and data["kernels"]
    assert "no GPU" in data["roofline"]["unavailable"] and "no GPU" in data["ncu"]["unavailable"]
    text = "\n".join(data["lines"])
    assert "roofline: no GPU" in text and "ncu: not measured: no GPU" in text and "top CPU ops" in text
    # Both clocks, host overhead apart; on the CPU labelled not meaningful (CPU ops, interpreter).
    clocks = data["clocks"]
    assert clocks["kind"] == "cpu" and clocks["meaningful"] is False and clocks["within_pct"] is None
    assert clocks["harness_ms"] > 0 and clocks["profiler_ms"] > 0
    assert abs(clocks["host_overhead_ms"] - (clocks["harness_ms"] - clocks["profiler_ms"])) < 1e-9
    assert "clocks: harness" in text and "profiler CPU ops" in text and "not meaningful" in text
    assert data["numerics"]["tf32"] is False
    plain = CliRunner().invoke(app, ["profile", str(SOFTMAX), str(SOFTMAX_SOL), "--device", "cpu",
                                     "--cache-dir", str(tmp_path), "--no-baselines", "--no-ncu"])
    assert plain.exit_code == 0 and "roofline: no GPU" in plain.output and "ncu" not in plain.output
    bad = CliRunner().invoke(app, ["profile", str(SOFTMAX), str(SOFTMAX_SOL), "--backend", "opencl"])
    assert bad.exit_code == 2


def test_roofline_fractions_and_lines():
    device = hardware.describe_device({"cuda": True, "gpu_name": "NVIDIA H100 80GB HBM3", "sm_count": 132})
    assert device["mem_bandwidth_gbs"] == 3350.0
    assert hardware.lookup("NVIDIA H100 PCIe")["sm_count"] == 114
    assert hardware.lookup("NVIDIA A100-SXM4-40GB")["mem_bandwidth_gbs"] == 1555.0
    assert hardware.lookup("NVIDIA H200")["mem_bandwidth_gbs"] == 4800.0
    # 2 x 268 MB at 1.0 ms: 537 GB/s... of 3350 -> 16%, memory-bound
    nbytes = 2 * 4096 * 16384 * 4
    roof = hardware.roofline_fractions(device, nbytes, None, "float32", 1.0)
    assert abs(roof["bandwidth_fraction"] - nbytes / 1e-3 / 3350e9) < 1e-9 and roof["bound"] == "memory"
    gemm = hardware.roofline_fractions(device, 3 * 4096 * 4096 * 4, 2 * 4096**3, "float32", 10.0)
    assert gemm["bound"] == "compute" and 0 < gemm["compute_fraction"] < 1
    floor, how = hardware.roofline_floor(device, nbytes, None, "float32")
    assert floor is not None and "GB/s" in how
    assert hardware.roofline_floor(hardware.describe_device({"cuda": False}), 1e6, None, "float32")[0] is None



def test_server_roofline_check_flags_a_time_below_the_floor():
    """Class 16 on the server's side: a median below the hardware floor for the problem's bytes is
    flagged impossible-speed; one above it is not; without a GPU the check says it was skipped."""
    from kernelagent.harness.server import verdict

    h100 = {"cuda": True, "gpu_name": "NVIDIA H100 80GB HBM3", "sm_count": 132}
    ready = {"input_bytes": 4096 * 16384 * 4, "output_bytes": 4096 * 16384 * 4, "param_bytes": 0,
             "flops": None, "output_dtype": "float32"}
    floor, _how = verdict.roofline_floor(h100, ready)
    assert floor is not None and abs(floor - 2 * 4096 * 16384 * 4 / 3350e9 * 1e3) < 0.05 * floor
    fast = verdict.check_roofline(h100, ready, floor * 0.1, margin=0.5)
    assert fast is not None and fast["kind"] == "impossible-speed" and fast["severity"] == "review"
    assert verdict.check_roofline(h100, ready, floor * 1.2, margin=0.5) is None
    skipped = verdict.check_roofline({"cuda": False}, ready, 1e-9, margin=0.5)
    assert skipped is not None and skipped["kind"] == "roofline" and skipped["severity"] == "info"

NCU_CSV = '''"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","dram__throughput.avg.pct_of_peak_sustained_elapsed","sm__throughput.avg.pct_of_peak_sustained_elapsed","sm__warps_active.avg.pct_of_peak_sustained_active","sm__maximum_warps_per_active_cycle_pct","launch__registers_per_thread","launch__shared_mem_per_block_static","launch__shared_mem_per_block_dynamic","launch__occupancy_limit_registers","launch__occupancy_limit_shared_mem","launch__occupancy_limit_blocks","launch__occupancy_limit_warps","gpu__time_duration.sum","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
"","","","","","","","%","%","%","%","register/thread","byte/block","byte/block","block","block","block","block","nsecond","ratio","ratio","ratio"
"0","1","python","h","softmax_row_kernel(const float *, float *, long)","1","7","41.2","20.5","45.0","50.0","128","4096","0","1","8","32","4","1,000","6.0","1.5","0.5"
"1","1","python","h","softmax_row_kernel(const float *, float *, long)","1","7","40.8","21.5","47.0","50.0","128","4096","0","1","8","32","4","1,100","6.0","1.5","0.5"
'''


def test_ncu_times_are_nanoseconds_whatever_unit_ncu_printed():
    """ncu scales each value to a fitting unit by default: a 4 ms kernel's gpu__time_duration came
    as 4.37 "msecond" on an H100 (2026-11-27), which the evidence read as 4.37 ns, so its clock
    check (Nsight Compute's kernel time against the reported median) could never fire. Times are
    converted to nanoseconds from the units row; the imports also ask for base units."""
    scaled = NCU_CSV.replace('"nsecond"', '"msecond"').replace('"1,000"', '"4.37"').replace('"1,100"', '"4.39"')
    kernels = profiling.summarise_ncu(profiling.parse_ncu_csv(scaled))
    assert kernels[0]["time_ns"] == pytest.approx(4.38e6) and kernels[0]["total_ns"] == pytest.approx(8.76e6)
    micro = NCU_CSV.replace('"nsecond"', '"usecond"').replace('"1,000"', '"182.5"').replace('"1,100"', '"182.5"')
    assert profiling.summarise_ncu(profiling.parse_ncu_csv(micro))[0]["time_ns"] == pytest.approx(182_500)
    # base units as printed: unchanged
    assert profiling.summarise_ncu(profiling.parse_ncu_csv(NCU_CSV))[0]["time_ns"] == pytest.approx(1050)
    from kernelagent.harness.server import kernel_evidence
    flags = kernel_evidence.judge({"kernels": [dict(kernels[0], name="softmax_row_kernel")]},
                                  {"softmax_row_kernel"}, median_ms=1.0, calls=2)
    assert [f["kind"] for f in flags] == ["clock-mismatch"]  # 4.38 ms of kernels a call, 1 ms claimed


def test_ncu_parsing_and_summary():
    kernels = profiling.summarise_ncu(profiling.parse_ncu_csv("==PROF== noise\n" + NCU_CSV))
    assert len(kernels) == 1
    k = kernels[0]
    assert k["base_name"] == "softmax_row_kernel" and k["launches"] == 2
    assert abs(k["dram_pct"] - 41.0) < 1e-9 and k["registers_per_thread"] == 128
    assert k["occupancy_limiter"] == "registers" and k["top_stalls"][0]["reason"] == "long_scoreboard"
    roof = {"bound": "memory", "bandwidth_fraction": 0.41, "compute_fraction": None, "achieved_gbs": 1373.5,
            "peak_gbs": 3350.0, "bytes": 536870912.0, "dtype": "float32", "roofline_fraction": 0.41,
            "floor_ms": 0.16}

    class R:  # the parts of an EvalResult the summary reads
        timings, speedups, kernels, fingerprint = {}, {}, [], {"cuda": True}

    lines = profiling.summary_lines(R(), roof, {"kernels": kernels})
    text = "\n".join(lines)
    print("\n" + text)
    assert "memory-bound at 41% of peak DRAM bandwidth" in text
    assert "occupancy limited by registers (128/thread)" in text
    assert "top stalls: long scoreboard" in text
    assert len(lines) <= 8


def _fake_result(median_ms, kernels, meaningful=True, source="in-process"):
    from kernelagent.harness.result import EvalResult, Timing

    result = EvalResult(status="correct", kernels=kernels, fingerprint={"cuda": True})
    result.timings["candidate"] = Timing(median_ms=median_ms, q1_ms=median_ms, q3_ms=median_ms, min_ms=median_ms,
                                         reps=10, meaningful=meaningful, source=source)
    return result


def test_clocks_on_synthetic_profiles():
    # Top rows only (the profiler keeps 10): the total comes from a row's share, so rows cut off count.
    kernels = [{"name": "softmax_kernel", "total_ms": 0.090, "calls": 1, "share": 0.9, "own": True, "kind": "device"},
               {"name": "copy", "total_ms": 0.005, "calls": 1, "share": 0.05, "own": False, "kind": "device"}]
    c = profiling.clocks(_fake_result(0.1025, kernels))
    assert abs(c["profiler_ms"] - 0.1) < 1e-12 and abs(c["host_overhead_ms"] - 0.0025) < 1e-12
    assert abs(c["diff_pct"] - 2.5) < 1e-9 and c["within_pct"] is True and c["kind"] == "device"
    line = profiling.clock_line(c)
    assert line == ("clocks: harness 0.1025 ms/call median (in-process); profiler device kernels 0.1000 ms/call; "
                    "host overhead 0.0025 ms/call (+2.5% of the profiler's); within 3%")
    far = profiling.clocks(_fake_result(0.110, kernels))
    assert far["within_pct"] is False and "NOT within 3%" in profiling.clock_line(far)
    small = profiling.clocks(_fake_result(0.030, [{"name": "k", "total_ms": 0.010, "calls": 1, "share": 1.0,
                                                   "kind": "device"}]))
    assert small["within_pct"] is None and "no agreement target" in small["note"]
    assert "unavailable" in profiling.clocks(_fake_result(0.1, []))
    summary = profiling.summary_lines(_fake_result(0.1025, kernels), {"unavailable": "x"}, None)
    assert line in summary
