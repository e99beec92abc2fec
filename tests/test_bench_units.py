"""Bench pieces without the harness: discovery, metrics (exact values on synthetic records),
pass@k, the store (threads, transactions, keys), reports and the compare page."""

from __future__ import annotations

import csv
import json
import math
import threading
from pathlib import Path

import pytest

from kernelagent.bench import metrics as M
from kernelagent.bench.discover import discover, find_candidates, parse_levels
from kernelagent.bench.report import load_run, write_compare, write_reports
from kernelagent.bench.store import Store, evaluation_key
from kernelagent.errors import UserError
from tests.conftest import BENCHMARKS, TESTS

SUITE = TESTS / "bench_suite"


# -- synthetic runs (also used by the browser test) ---------------------------------------
def record(key: str, *, correct: bool, compiled: bool = True, eager: float | None = None,
           inductor: float | None = None, samples: int = 1, correct_samples: int | None = None,
           tokens: int = 0, cost: float = 0.0, wall: float = 1.0, status: str | None = None) -> dict:
    level = key.split("/")[0] if "/" in key else None
    return {"key": key, "level": level, "name": key.split("/")[-1],
            "status": status or ("correct" if correct else "incorrect"), "compiled": compiled, "correct": correct,
            "speedup_eager": eager, "speedup_inductor": inductor, "timings_meaningful": eager is not None,
            "samples": samples, "correct_samples": int(correct) if correct_samples is None else correct_samples,
            "tokens": {"prompt": tokens * 3 // 4, "completion": tokens - tokens * 3 // 4, "total": tokens},
            "cost_usd": cost, "wall_s": wall, "reason": "" if correct else "output mismatch"}


SYNTHETIC = [
    record("level1/1_relu", correct=True, eager=1.2, inductor=1.05, tokens=12000, cost=0.031, wall=40),
    record("level1/2_gelu", correct=True, eager=2.5, inductor=1.6, tokens=18000, cost=0.052, wall=65),
    record("level1/3_softmax", correct=True, eager=3.1, inductor=2.2, tokens=25000, cost=0.071, wall=90),
    record("level1/4_matmul", correct=True, eager=0.8, inductor=0.7, tokens=30000, cost=0.088, wall=120),
    record("level1/5_layernorm", correct=False, tokens=22000, cost=0.061, wall=80),
    record("level2/1_linear_gelu", correct=True, eager=1.9, inductor=1.4, tokens=26000, cost=0.07, wall=95),
    record("level2/2_conv_relu", correct=False, compiled=False, status="compile_error", tokens=40000, cost=0.12,
           wall=150),
    record("level2/3_add_rmsnorm", correct=True, eager=1.5, inductor=1.0, tokens=15000, cost=0.04, wall=50),
    record("level3/1_mlp", correct=True, eager=1.1, inductor=0.95, tokens=50000, cost=0.15, wall=200),
    record("level3/2_attention", correct=False, status="rejected", tokens=60000, cost=0.2, wall=240),
]


def synthetic_run(store_path: Path, run_id: str = "synthetic", records: list[dict] | None = None,
                  out_dir: Path | None = None) -> Path:
    """A finished agent-mode run with GPU-like speedups, written straight into a store."""
    records = SYNTHETIC if records is None else records
    out_dir = out_dir or store_path.parent / run_id
    with Store(store_path) as store:
        store.open_run(run_id, "agent", {"root": "/bench", "model": "openai/synthetic", "max_turns": 10},
                       str(out_dir))
        store.add_problems(run_id, [{"key": r["key"], "level": r["level"], "name": r["name"], "path": "/bench",
                                     "sha256": "0" * 64} for r in records])
        for r in records:
            store.finish_problem(run_id, r["key"], "done", r)
        store.update_run(run_id, status="finished", add_wall_s=123.0,
                         fingerprint={"cuda": True, "gpu_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0",
                                      "triton": "3.6.0", "python": "3.11.7", "driver": "570.00"})
        write_reports(store, run_id, out_dir)
    return out_dir


# -- discovery ----------------------------------------------------------------------------
def test_discover_levels_filter_limit_and_candidates():
    refs = discover(SUITE / "problems")
    assert [r.key for r in refs] == ["level1/1_relu", "level1/2_double", "level2/1_relu_half", "level2/2_add_one",
                                     "level2/3_negate"]  # helper_not_a_problem.py and README.txt skipped
    assert [r.key for r in discover(SUITE / "problems", levels="2", limit=2)] == ["level2/1_relu_half",
                                                                                   "level2/2_add_one"]
    assert [r.key for r in discover(SUITE / "problems", pattern="*relu*")] == ["level1/1_relu",
                                                                               "level2/1_relu_half"]
    assert [r.key for r in discover(SUITE / "problems" / "level1")] == ["level1/1_relu", "level1/2_double"]
    cdir = SUITE / "candidates"
    assert [p.name for p in find_candidates(cdir, refs[0])] == ["a_good.py", "b_wrong.py", "c_segfault.py",
                                                                 "d_good_copy.py"]
    assert [p.name for p in find_candidates(cdir, refs[1])] == ["2_double.py"]  # flat CDIR/<stem>.py
    assert find_candidates(cdir, refs[4]) == []
    with pytest.raises(UserError):
        parse_levels("one")


def test_discover_kernelbench_and_our_layouts(tmp_path):
    kb = [r.key for r in discover(TESTS / "kernelbench_layout")]
    assert kb == ["level1/19_ReLU", "level2/7_Scale_Shift"]
    ours = discover(BENCHMARKS)
    assert ours and all(r.level in ("level1", "level2", "level3") for r in ours)
    assert [r.key for r in ours][:2] == ["level1/1_relu", "level1/2_gelu"]  # natural order: 2 before 10
    # A KernelBench checkout's root: problems under KernelBench/levelN/.
    (tmp_path / "KernelBench" / "level1").mkdir(parents=True)
    (tmp_path / "KernelBench" / "level1" / "1_x.py").write_text(
        (TESTS / "kernelbench_layout" / "level1" / "19_ReLU.py").read_text())
    assert [r.key for r in discover(tmp_path)] == ["level1/1_x"]
    sol = find_candidates(BENCHMARKS / "solutions", ours[0])
    assert sol and sol[0].parent.name == "level1"  # CDIR/levelN/<stem>.py


# -- metrics ------------------------------------------------------------------------------
def test_metrics_exact_on_synthetic_records():
    m = M.compute(SYNTHETIC)
    assert m["problems"] == 10 and m["compiled"] == 9 and m["correct"] == 7
    assert m["compile_rate"] == 0.9 and m["correctness_rate"] == 0.7
    # inductor speedups of the correct ones: 1.05 1.6 2.2 0.7 1.4 1.0 0.95
    assert m["fast_p"]["inductor"] == {"0": 0.7, "1.0": 0.4, "1.5": 0.2, "2.0": 0.1}
    # eager: 1.2 2.5 3.1 0.8 1.9 1.5 1.1 (1.5 is not > 1.5)
    assert m["fast_p"]["eager"] == {"0": 0.7, "1.0": 0.6, "1.5": 0.3, "2.0": 0.2}
    expected = math.exp(sum(map(math.log, [1.05, 1.6, 2.2, 0.7, 1.4, 1.0, 0.95])) / 7)
    assert m["geomean_speedup"]["inductor"] == pytest.approx(expected)
    assert m["tokens"]["total"] == 298000 and m["cost_usd"] == pytest.approx(0.883)
    assert m["wall_s"] == pytest.approx(1130) and m["per_problem"]["wall_s"] == pytest.approx(113)
    lv = m["by_level"]
    assert (lv["level1"]["problems"], lv["level1"]["correct"], lv["level2"]["compiled"]) == (5, 4, 2)
    assert lv["level3"]["fast_p"]["inductor"]["0"] == 0.5 and lv["level3"]["fast_p"]["inductor"]["1.0"] == 0.0


def test_rejected_or_unmeasured_never_count_as_fast():
    flagged = record("a", correct=False, eager=5.0, inductor=5.0, status="rejected")
    cpu = {**record("b", correct=True), "speedup_eager": None, "speedup_inductor": None}
    m = M.compute([flagged, cpu])
    assert m["correctness_rate"] == 0.5
    assert all(v == 0.0 for b in m["fast_p"].values() for v in b.values())
    assert m["geomean_speedup"] == {"eager": None, "inductor": None}


def test_pass_at_k():
    assert M.pass_at_k(4, 2, 1) == pytest.approx(0.5)
    assert M.pass_at_k(4, 2, 3) == 1.0
    assert M.pass_at_k(5, 1, 2) == pytest.approx(1 - math.comb(4, 2) / math.comb(5, 2))
    assert M.pass_at_k(3, 0, 1) == 0.0
    recs = [record("p", correct=True, samples=4, correct_samples=2), record("q", correct=False, samples=1),
            {**record("r", correct=False, samples=0), "samples": 0}]
    pk = M.pass_at(recs)
    assert pk["1"] == {"value": pytest.approx(0.5 / 3), "problems": 3}
    assert pk["4"] == {"value": pytest.approx(0.5), "problems": 2}  # q has 1 sample; r (none) counts as 0


# -- store --------------------------------------------------------------------------------
def test_store_threads_transactions_and_keys(tmp_path):
    path = tmp_path / "s.sqlite"
    fp = {"python": "3.11", "torch": "2.13", "triton": "3.9", "cuda": False, "device": "cpu"}
    k1 = evaluation_key("p" * 64, "c" * 64, {"trials": 5}, fp)
    assert k1 == evaluation_key("p" * 64, "c" * 64, {"trials": 5}, {**fp, "device": "cuda:3"})  # index ignored
    assert k1 != evaluation_key("p" * 64, "c" * 64, {"trials": 4}, fp)
    assert k1 != evaluation_key("p" * 64, "d" * 64, {"trials": 5}, fp)
    assert k1 != evaluation_key("p" * 64, "c" * 64, {"trials": 5}, {**fp, "torch": "2.12"})
    with Store(path) as store:
        store.open_run("r", "candidates", {"root": "x"}, str(tmp_path))

        def work(i: int) -> None:
            for j in range(20):
                store.record_evaluation(f"k{i}-{j}", {"status": "correct", "flags": []}, settings={}, fingerprint=fp,
                                        run_id="r", attempt={"run_id": "r", "problem_key": f"p{i}",
                                                             "sample": f"s{j}", "candidate_sha256": "c"})

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert store.evaluations_performed("r") == 160 and len(store.attempts("r")) == 160
        with pytest.raises(RuntimeError):  # a failed transaction leaves nothing behind
            with store.transaction() as db:
                db.execute("INSERT INTO evaluation_log (key, created) VALUES ('x', 0)")
                raise RuntimeError("boom")
        assert store.evaluations_performed() == 160
        assert store.lookup(["nope", "k3-4"])[0] == "k3-4"
    with Store(path) as again:  # reopened: everything is there, WAL mode on
        assert again.evaluations_performed("r") == 160
        assert again._query("PRAGMA journal_mode")[0][0] == "wal"


# -- reports ------------------------------------------------------------------------------
def test_reports_from_the_store(tmp_path):
    out = synthetic_run(tmp_path / "s.sqlite")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["correct"] == 7 and len(summary["problems"]) == 10
    rows = list(csv.DictReader((out / "problems.csv").open()))
    assert [r["key"] for r in rows][:2] == ["level1/1_relu", "level1/2_gelu"]
    assert rows[0]["speedup_inductor"] == "1.05" and rows[0]["tokens_total"] == "12000"
    html = (out / "report.html").read_text()
    assert html.count('<svg class="plot"') == 3
    assert 'id="plot-fast-p" data-points="8"' in html  # 4 thresholds x 2 baselines
    assert 'id="plot-cost" data-points="7"' in html  # one point per correct problem
    for forbidden in ("http://", "https://", "<link", "src=", "@import", "url("):
        assert forbidden not in html, forbidden  # self-contained: nothing to fetch


def test_report_and_compare_commands(tmp_path):
    from typer.testing import CliRunner

    from kernelagent.cli import app

    store = tmp_path / "s.sqlite"
    out_a = synthetic_run(store, "model-a")
    better = [{**r, "speedup_inductor": r["speedup_inductor"] * 1.5} if r["speedup_inductor"] else r
              for r in SYNTHETIC]
    synthetic_run(store, "model-b", better)
    (out_a / "report.html").unlink()
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(out_a)])  # a run directory
    assert result.exit_code == 0, result.output
    assert (out_a / "report.html").is_file()
    result = runner.invoke(app, ["report", "--compare", "model-a", "model-b", "--store", str(store),
                                 "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert data["a"]["metrics"]["fast_p"]["inductor"]["1.5"] == 0.2
    assert data["b"]["metrics"]["fast_p"]["inductor"]["1.5"] == 0.4  # 1.575 2.4 3.3 2.1
    html = (tmp_path / "cmp" / "compare.html").read_text()
    assert 'id="plot-versus" data-points="7"' in html
    result = runner.invoke(app, ["report", "--list", "--store", str(store)])
    assert "model-a" in result.output and "model-b" in result.output
    result = runner.invoke(app, ["report", "nope", "--store", str(store)])
    assert result.exit_code == 2 and "no run 'nope'" in result.output


def test_partial_run_report(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.open_run("p", "candidates", {"root": "x", "candidates": "y"}, str(tmp_path / "p"))
        store.add_problems("p", [{"key": "a", "name": "a", "path": "a", "sha256": "1"},
                                 {"key": "b", "name": "b", "path": "b", "sha256": "2"}])
        store.finish_problem("p", "a", "done", record("a", correct=True))
        data = load_run(store, "p")
        assert data["pending"] == ["b"] and data["metrics"]["problems"] == 1
        write_reports(store, "p", tmp_path / "p")
    assert "1 problem(s) not finished yet" in (tmp_path / "p" / "report.html").read_text()


def test_backend_reaches_the_harness_and_the_run_id():
    from typer.testing import CliRunner

    from kernelagent.bench import BenchSpec
    from kernelagent.cli import app

    triton_spec = BenchSpec(root=str(BENCHMARKS), candidates=str(BENCHMARKS / "solutions"))
    cuda_spec = BenchSpec(root=str(BENCHMARKS), candidates=str(BENCHMARKS / "solutions_cuda"), backend="cuda")
    assert triton_spec.eval_config().backend == "triton"
    assert cuda_spec.eval_config().backend == "cuda"
    assert BenchSpec(root=str(BENCHMARKS), backend="cuda").run_id() != BenchSpec(root=str(BENCHMARKS)).run_id()
    result = CliRunner().invoke(app, ["bench", str(BENCHMARKS), "--backend", "hip"], env={"COLUMNS": "120"})
    assert result.exit_code == 2 and "--backend must be triton or cuda" in result.output


def test_compare_with_different_problem_sets_uses_the_shared_ones(tmp_path):
    from typer.testing import CliRunner

    from kernelagent.cli import app

    store = tmp_path / "s.sqlite"
    synthetic_run(store, "all-ten")
    synthetic_run(store, "first-six", SYNTHETIC[:6])
    result = CliRunner().invoke(app, ["report", "--compare", "all-ten", "first-six", "--store", str(store),
                                      "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    note = "the runs' problem sets differ: compared on the 6 shared problems (4 only in A, 0 only in B)"
    assert result.stderr.strip() == f"note: {note}"
    data = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert data["note"] == note and data["problems"]["shared"] == 6 and len(data["problems"]["only_a"]) == 4
    assert data["a"]["metrics"]["problems"] == data["b"]["metrics"]["problems"] == 6
    assert data["a"]["metrics"] == data["b"]["metrics"]  # the same six records: B - A is 0
    assert note.replace("'", "&#x27;") in (tmp_path / "cmp" / "compare.html").read_text()


# -- fast_p on the lower bound of the speedup interval (issue 13) ----------------------------
def test_fast_p_decides_on_the_lower_bound_and_reports_both():
    from kernelagent.bench.progress import describe_record
    from kernelagent.bench.report import _problem_table, _xi, problems_csv

    noisy = {**record("level1/a", correct=True, eager=3.0, inductor=1.12), "interval_inductor": [0.9, 1.3],
             "interval_eager": [2.8, 3.2]}
    sure = {**record("level1/b", correct=True, eager=3.0, inductor=1.12), "interval_inductor": [1.05, 1.2]}
    point_only = record("level1/c", correct=True, eager=3.0, inductor=1.12)  # no interval measured
    wrong = {**record("level1/d", correct=False), "speedup_inductor": 5.0, "interval_inductor": [4.0, 6.0]}
    records = [noisy, sure, point_only, wrong]
    # Point beats 1.0 but the lower bound does not: not fast_1.
    assert M.fast_p([noisy], "inductor", 1.0) == 0.0
    assert M.fast_p([noisy], "inductor", 1.0, rule="point") == 1.0
    assert M.fast_p([sure], "inductor", 1.0) == 1.0 and M.fast_p([sure], "inductor", 1.1) == 0.0
    assert M.fast_p([point_only], "inductor", 1.0) == 1.0  # the point estimate decides, and it is counted
    assert M.speedup_low(noisy, "inductor") == 0.9 and M.speedup_low(point_only, "inductor") == 1.12
    assert M.interval(wrong, "inductor") is None  # an incorrect kernel has no speedup at all
    m = M.compute(records)
    assert m["fast_p"]["inductor"]["1.0"] == pytest.approx(2 / 4)  # sure + point_only
    assert m["fast_p_point"]["inductor"]["1.0"] == pytest.approx(3 / 4)
    assert m["fast_p"]["eager"]["2.0"] == pytest.approx(3 / 4)
    assert m["point_only"] == {"eager": 2, "inductor": 1}
    assert "lower bound" in m["fast_p_rule"]
    # Shown with both numbers: the table, the CSV and the progress line.
    assert _xi(noisy, "inductor") == "1.120x [0.900, 1.300]" and _xi(point_only, "inductor") == "1.120x"
    assert "1.120x [0.900, 1.300]" in _problem_table(records)
    rows = list(csv.DictReader(problems_csv(records).splitlines()))
    assert rows[0]["speedup_inductor_low"] == "0.9" and rows[0]["speedup_inductor_high"] == "1.3"
    assert rows[2]["speedup_inductor_low"] == ""
    assert describe_record(noisy) == "correct, 1.12x [0.90, 1.30] vs inductor"


def test_report_shows_other_inductor_modes_by_name(tmp_path):
    rec = {**record("level1/1_relu", correct=True, eager=2.0, inductor=1.2), "interval_inductor": [1.1, 1.3],
           "raw_speedups": {"eager": 2.0, "compile": 1.2, "compile:reduce-overhead": 0.8},
           "raw_intervals": {"compile:reduce-overhead": [0.7, 0.9]}}
    store = tmp_path / "s.sqlite"
    synthetic_run(store, "modes", [rec])
    with Store(store) as s:
        paths = write_reports(s, "modes", tmp_path / "modes")
    html = paths["html"].read_text()
    assert "Inductor reduce-overhead 0.800x [0.700, 0.900]" in html
    assert "fast_1.0 (lower bound)" in html and "fast_1.0 (point estimate)" in html


def test_records_carry_the_intervals_from_the_result():
    from kernelagent.bench.runner import ProblemRef, candidates_record, summarise

    result = {"status": "correct", "compiled": True, "flags": [],
              "timings": {"candidate": {"meaningful": True}, "compile": {"meaningful": True}},
              "speedups": {"eager": 2.0, "compile": 1.1, "compile:max-autotune-no-cudagraphs": 0.9},
              "speedup_intervals": {"eager": [1.9, 2.1], "compile": [0.95, 1.2]}}
    summary = summarise(result)
    assert summary["interval_inductor"] == [0.95, 1.2] and summary["interval_eager"] == [1.9, 2.1]
    ref = ProblemRef(path=Path("/b/level1/x.py"), level="level1", name="x")
    rec = candidates_record(ref, [{"summary": summary, "sample": "x.py", "reused": False}])
    assert rec["interval_inductor"] == [0.95, 1.2]
    assert rec["raw_speedups"]["compile:max-autotune-no-cudagraphs"] == 0.9
    assert M.fast_p([rec], "inductor", 1.0) == 0.0 and M.fast_p([rec], "inductor", 1.0, rule="point") == 1.0
    cpu = summarise({**result, "timings": {"candidate": {"meaningful": False}}})
    assert cpu["interval_inductor"] is None and cpu["speedup_inductor"] is None
