"""`kernelagent export sft`: rows from recorded `optimize` runs (tests/rl_fixtures/recorded: real
loop, real CPU harness, scripted text-mode replies)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelagent.cli import app
from kernelagent.rl.sft import export_sft, reasoning_of, stats_path_for
from tests.rl_fixtures.common import FIXTURE_RUNS, GOOD, GOOD_B, LONG, MEDIUM, SHORT


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_reasoning_drops_code_and_keeps_prose():
    messages = [{"role": "assistant", "content": "Plan A.\n\n```python\nx = 1\n```\n"},
                {"role": "user", "content": "status: incorrect"},
                {"role": "assistant", "content": "Fix: B.\n```python\ny = 2\n```"}]
    assert reasoning_of(messages) == "Plan A.\n\nFix: B."


def test_export_keeps_verified_dedupes_and_prefers_concise(tmp_path):
    out = tmp_path / "sft.jsonl"
    stats = export_sft([FIXTURE_RUNS], min_speedup=0.0, out=out, include_test=True)
    rows = rows_of(out)
    # d_fail has no correct kernel; a_long and b_short share a kernel (b_short is more
    # concise); c_fix's kernel differs but its reasoning is longer than b_short's.
    assert [(r["problem_id"], r["split"], Path(r["run_dir"]).name) for r in rows] == [
        ("level1/1_relu", "test", "e_other"), ("relu_problem", "train", "b_short")]
    row = rows[1]
    # a text-mode run keeps its text-mode prompt and its turns: the reply, then the feedback
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "user"]
    assert row["mode"] == "text" and row["tools"] == "" and row["turns"] == 1
    recorded = json.loads((FIXTURE_RUNS / "b_short" / "trajectory.json").read_text())["messages"]
    assert [m["content"] for m in row["messages"]] == [m["content"] for m in recorded]
    assert "There are no tools in this conversation" in row["messages"][0]["content"]
    assert row["reasoning_chars"] == len(SHORT) and row["speedup"] is None
    assert stats["rows"] == 2 and stats["problems"] == 2 and stats["runs_read"] == 5
    assert stats["skipped"] == {"no_verified_kernel": 1, "duplicate_kernel": 1, "over_per_problem": 1}
    # by default, rows of test-split problems are left out
    default = export_sft([FIXTURE_RUNS], min_speedup=0.0, out=tmp_path / "train.jsonl")
    assert [r["problem_id"] for r in rows_of(tmp_path / "train.jsonl")] == ["relu_problem"]
    assert default["skipped"]["test_split"] == 1
    assert stats["mean_reasoning_chars"] == pytest.approx(len(SHORT))
    assert json.loads(stats_path_for(out).read_text())["rows"] == 2

    two = export_sft([FIXTURE_RUNS / n for n in ("a_long", "c_fix", "d_fail")], 0.0,
                     tmp_path / "two.jsonl", per_problem=2)
    kept = rows_of(tmp_path / "two.jsonl")
    assert {Path(r["run_dir"]).name for r in kept} == {"a_long", "c_fix"} and two["rows"] == 2
    c_fix = next(r for r in kept if Path(r["run_dir"]).name == "c_fix")
    # every turn, in order: the failed try and its feedback, then the fix and its feedback
    assert [m["role"] for m in c_fix["messages"]] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert c_fix["messages"][2]["content"].startswith("Try a leaky variant.")
    assert GOOD_B.rstrip() in c_fix["messages"][4]["content"] and c_fix["turns"] == 2
    # curation: at most one turn drops c_fix; a reasoning cap below its length too
    one = export_sft([FIXTURE_RUNS / n for n in ("a_long", "c_fix")], 0.0, tmp_path / "one.jsonl",
                     per_problem=2, max_turns=1)
    assert one["rows"] == 1 and one["skipped"] == {"over_max_turns": 1}
    short = export_sft([FIXTURE_RUNS / n for n in ("a_long", "b_short", "c_fix")], 0.0, tmp_path / "s.jsonl",
                       per_problem=3, max_reasoning_chars=len(SHORT))
    assert [Path(r["run_dir"]).name for r in rows_of(tmp_path / "s.jsonl")] == ["b_short"]
    assert short["skipped"] == {"over_max_reasoning_chars": 2}
    pct = export_sft([FIXTURE_RUNS / n for n in ("a_long", "b_short", "c_fix")], 0.0, tmp_path / "p.jsonl",
                     per_problem=3, reasoning_percentile=50)
    assert pct["skipped"] == {"over_reasoning_percentile": 1}  # the median keeps the two shorter
    assert {Path(r["run_dir"]).name for r in rows_of(tmp_path / "p.jsonl")} == {"b_short", "c_fix"}


def measured_copy(tmp_path: Path, speedups: dict[str, float]) -> Path:
    """The recorded runs, with the GPU timings a real machine would have reported."""
    root = tmp_path / "runs"
    shutil.copytree(FIXTURE_RUNS, root)
    for name, value in speedups.items():
        path = root / name / "summary.json"
        summary = json.loads(path.read_text())
        summary["best"].update(timings_meaningful=True, speedup_vs_inductor=value, speedup_vs_eager=value * 2)
        path.write_text(json.dumps(summary))
    return root


def test_speed_filter_and_distribution(tmp_path):
    root = measured_copy(tmp_path, {"a_long": 1.6, "b_short": 0.8, "c_fix": 2.5})
    out = tmp_path / "fast.jsonl"
    stats = export_sft([root], min_speedup=1.0, out=out)
    rows = rows_of(out)
    # b_short (0.8x) is too slow, e_other was not measured; of a_long and c_fix (different
    # kernels, same problem) the more concise reasoning wins.
    assert len("Try a leaky variant.\n\n" + MEDIUM) < len(LONG)
    assert [Path(r["run_dir"]).name for r in rows] == ["c_fix"]
    assert stats["skipped"]["below_min_speedup"] == 1 and stats["skipped"]["unmeasured"] == 1
    assert rows[0]["speedup_baseline"] == "compile"
    everything = export_sft([root], min_speedup=0.0, out=tmp_path / "all.jsonl", per_problem=5,
                            include_unmeasured=True, include_test=True)
    dist = everything["speedup"]
    assert dist["measured"] == 2 and dist["unmeasured"] == 1  # a_long/b_short share a kernel
    assert dist["histogram"]["1.5-2x"] + dist["histogram"]["2-3x"] + dist["histogram"]["<1x"] == 2


def test_export_cli(tmp_path):
    out = tmp_path / "sft.jsonl"
    result = CliRunner().invoke(app, ["export", "sft", str(FIXTURE_RUNS), "--min-speedup", "0",
                                      "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "1 row from 5 runs" in result.output and "test_split 1" in result.output and out.exists() and stats_path_for(out).exists()
    missing = CliRunner().invoke(app, ["export", "sft", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "not found" in missing.output
    default = CliRunner().invoke(app, ["export", "sft", str(FIXTURE_RUNS), "--out", str(tmp_path / "d.jsonl")])
    # CPU runs are unmeasured: no row is exit 1 (no correct kernel to export), and nothing is written
    assert default.exit_code == 1 and "no row to export" in default.output and "unmeasured" in default.output
    assert not (tmp_path / "d.jsonl").exists() and not stats_path_for(tmp_path / "d.jsonl").exists()
