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
    rows = [{**base, "problem": "a", "harness_ms": 0.1025, "profiler_ms": 0.1, "diff_pct": 2.5,
             "host_overhead_ms": 0.0025, "within_pct": True},
            {**base, "problem": "b", "harness_ms": 0.2, "profiler_ms": 0.1, "diff_pct": 100.0,
             "host_overhead_ms": 0.1, "within_pct": False},
            {**base, "problem": "c", "harness_ms": 0.02, "profiler_ms": 0.005, "diff_pct": 300.0,
             "host_overhead_ms": 0.015, "within_pct": None}]
    text = mod.table(rows)
    assert "GPU: NVIDIA H100 80GB HBM3, driver 580, torch 2.11, triton 3.6" in text
    assert "| a | correct | 0.1025 | 0.1000 | +2.5 | 0.0025 | yes |" in text
    assert "| b | correct |" in text and "| NO |" in text and "n/a (<50 us)" in text
    assert "1 of 2 problems of 50 us or more agree within 3%." in text
    assert "NOT MEANINGFUL" not in text


def test_no_problem_selected_is_bad_input(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--filter", "no-such-problem", "--device", "cpu"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no problem with a solution" in proc.stderr
