"""benchmarks/profiler_agreement.py on the CPU: the plumbing end to end (one harness, profiling
on, JSON lines as it goes, the Markdown table, the time cap) with every number labelled not
meaningful; and the table's verdicts on synthetic GPU rows."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "profiler_agreement.py"


def load_script():
    spec = importlib.util.spec_from_file_location("profiler_agreement_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_run_with_a_time_cap(tmp_path):
    # '1*' selects 1_relu then 10_conv2d, 11_..., in natural order; a tiny cap runs only the first.
    proc = subprocess.run([sys.executable, str(SCRIPT), "--filter", "1*", "--device", "cpu", "--max-minutes", "0.01",
                           "--jobs", "1", "--out", str(tmp_path / "rows.jsonl"), "--summary", str(tmp_path / "table.md")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [r["problem"] for r in rows] == ["ours/level1/1_relu"]
    row = rows[0]
    assert row["status"] == "correct" and row["gpu"] == "cpu" and row["torch"] and row["triton"]
    assert row["meaningful"] is False and row["within_pct"] is None and row["kind"] == "cpu"
    assert row["harness_ms"] > 0 and row["profiler_ms"] > 0
    table = (tmp_path / "table.md").read_text()
    assert table == proc.stdout
    assert "NOT MEANINGFUL: no GPU" in table
    assert "| ours/level1/1_relu | correct |" in table and "not meaningful (CPU)" in table
    assert "| ours/level1/10_conv2d | not run |" in table and "time cap" in table


def test_problems_are_in_flight_together_and_the_table_keeps_their_order(tmp_path):
    """--jobs 2: both evaluations run in the one server at once (their server spans overlap); the
    table lists them in the suite's order whichever finished first."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--filter", "1[45]_*", "--device", "cpu", "--jobs", "2",
                           "--out", str(tmp_path / "rows.jsonl")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["problem"]: r for r in map(json.loads, (tmp_path / "rows.jsonl").read_text().splitlines())}
    assert set(rows) == {"ours/level1/14_sigmoid", "ours/level1/15_leaky_relu"}
    assert all(r["status"] == "correct" for r in rows.values())
    (a0, a1), (b0, b1) = rows["ours/level1/14_sigmoid"]["span"], rows["ours/level1/15_leaky_relu"]["span"]
    assert a0 < b1 and b0 < a1, (a0, a1, b0, b1)
    assert proc.stdout.index("| ours/level1/14_sigmoid |") < proc.stdout.index("| ours/level1/15_leaky_relu |")


def test_table_verdicts_on_synthetic_gpu_rows():
    mod = load_script()
    base = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580", "torch": "2.11", "triton": "3.6", "python": "3.12",
            "status": "correct", "meaningful": True}

    def third(harness, profiler, ncu):
        diff = 100 * (harness - profiler) / profiler
        return {"status": "correct", "harness_ms": harness, "profiler_ms": profiler, "ncu_ms": ncu, "diff_pct": diff,
                "within_pct": abs(diff) <= 3, "harness_vs_ncu_pct": 100 * (harness - ncu) / ncu,
                "profiler_vs_ncu_pct": 100 * (profiler - ncu) / ncu}

    rows = [{**base, "problem": "a", "harness_ms": 0.1025, "profiler_ms": 0.1, "diff_pct": 2.5,
             "host_overhead_ms": 0.0025, "within_pct": True},
            # a miss with no third clock: unexplained
            {**base, "problem": "b", "harness_ms": 0.2, "profiler_ms": 0.1, "diff_pct": 100.0,
             "host_overhead_ms": 0.1, "within_pct": False,
             "third": {"status": "not run", "ncu_note": "time cap"}},
            {**base, "problem": "c", "harness_ms": 0.02, "profiler_ms": 0.005, "diff_pct": 300.0,
             "host_overhead_ms": 0.015, "within_pct": None},
            # the profiler reads 10% high again, ncu agrees with the harness: explained
            {**base, "problem": "d", "harness_ms": 3.0, "profiler_ms": 3.3, "diff_pct": -9.1,
             "host_overhead_ms": -0.3, "within_pct": False, "third": third(3.01, 3.31, 3.02)},
            # ncu agrees with the profiler, not the harness: the harness's miss, unexplained
            {**base, "problem": "e", "harness_ms": 3.0, "profiler_ms": 3.3, "diff_pct": -9.1,
             "host_overhead_ms": -0.3, "within_pct": False, "third": third(3.0, 3.3, 3.29)},
            # the second evaluation agrees: the miss did not repeat, still unexplained
            {**base, "problem": "f", "harness_ms": 3.5, "profiler_ms": 3.0, "diff_pct": 16.7,
             "host_overhead_ms": 0.5, "within_pct": False, "third": third(3.02, 3.0, 3.0)}]
    text = mod.table(rows)
    assert "GPU: NVIDIA H100 80GB HBM3, driver 580, torch 2.11, triton 3.6" in text
    assert "| a | correct | 0.1025 | 0.1000 | +2.5 | 0.0025 | – | yes |" in text
    assert "| b | correct |" in text and "no: UNEXPLAINED (no ncu clock: time cap)" in text
    assert "n/a (<50 us)" in text
    assert ("| d | correct | 3.0000 | 3.3000 | -9.1 | -0.3000 | 3.0100 / 3.3100 / 3.0200 | no: explained: ncu "
            "agrees with the harness (-0.3%), the profiler reads +9.6%") in text
    assert "| e |" in text and "no: UNEXPLAINED (harness -8.8%, profiler +0.3% of ncu)" in text
    assert "| f |" in text and "no: UNEXPLAINED: did not repeat (a second evaluation read +0.7%)" in text
    assert ("1 of 5 problems of 50 us or more agree within 3%; of the 4 misses, 1 explained by the third "
            "clock (ncu agrees with the harness) and 3 unexplained.") in text
    assert "NOT MEANINGFUL" not in text


def test_the_third_clock_is_ncus_kernel_time_per_call():
    """results.apply_kernel_evidence keeps ncu's summed kernel time per profiled call, over every
    kernel (not only the 20 it lists), for the agreement table's third clock."""
    from kernelagent.harness.caller import results
    from kernelagent.harness.server import kernel_evidence
    from kernelagent.harness.result import EvalResult, Timing

    result = EvalResult(status="correct", correct=True, fingerprint={"cuda": True})
    result.timings["candidate"] = Timing(median_ms=1.0, q1_ms=1.0, q3_ms=1.0, min_ms=1.0, reps=10)
    kernels = [{"name": f"triton_k{i}", "launches": kernel_evidence.CALLS, "total_ns": 40_000.0}
               for i in range(25)]
    results.apply_kernel_evidence(result, {"kernels": kernels, "seconds": 1.0},
                                  "import triton\n@triton.jit\n" + "".join(f"def triton_k{i}(): pass\n"
                                                                           for i in range(25)))
    assert len(result.kernel_evidence["kernels"]) == 20
    assert abs(result.kernel_evidence["per_call_ms"] - 25 * 0.04 / kernel_evidence.CALLS) < 1e-12
    # no kernel time, no third clock
    empty = EvalResult(status="correct", correct=True, fingerprint={"cuda": True})
    results.apply_kernel_evidence(empty, {"unavailable": "ncu was not found"}, "")
    assert "per_call_ms" not in empty.kernel_evidence


def test_no_problem_selected_is_bad_input(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--filter", "no-such-problem", "--device", "cpu"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no problem with a solution" in proc.stderr
