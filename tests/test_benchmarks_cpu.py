"""No false positives: every known-good solution under benchmarks/solutions/ passes the
harness, defences included, on the CPU (Triton interpreter, smoke inputs, short timing)."""

from __future__ import annotations

import pytest

from kernelagent.harness import EvalConfig, Evaluator, Status, StageTimeouts
from tests.conftest import BENCHMARKS, read

# One worker for the file (pytest-xdist): its module fixtures (its evaluator) are made once.
pytestmark = pytest.mark.xdist_group("benchmarks_cpu")

SOLUTIONS = sorted((BENCHMARKS / "solutions").glob("level*/*.py"))


@pytest.fixture(scope="module")
def cpu_evaluator(cache_dir):
    with Evaluator(device="cpu", cache_dir=cache_dir) as ev:
        yield ev


CONFIG = EvalConfig(trials=2, target_ms=5, warmup_ms=1, min_reps=2, max_reps=3, baselines=False,
                    timeouts=StageTimeouts(start=60, load=60, compile=120, correctness=240, timing=120))


# Beside a second worker on the same 2 cores: an honest short loop's server clock can run three
# times its in-process one, and these once ran `alone` because the harness then rejected it as
# tampering. On the CPU the gross rule now asks the claim against the quickest of the server's
# segments (server/verdict.py _trusted_time; test_verdict.py has CI's numbers): no honest solution
# here may be flagged under load.
@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_known_good_solution_passes_with_defences(cpu_evaluator, solution):
    problem = BENCHMARKS / solution.parent.name / solution.name
    result = cpu_evaluator.evaluate(problem, read(solution), CONFIG)
    assert result.status == Status.CORRECT, result.feedback() + "\n" + result.log
    bad = [f for f in result.flags if f.severity in ("reject", "review")]
    assert not bad, bad
    assert result.passed


def test_each_check_records_where_its_time_went_on_the_servers_clock(cpu_evaluator):
    """Issue 59: a correctness stage of 4-7 s beside others on an H200 against 0.5-0.9 s alone. Each
    check's record says where its time went, on the server's clock: the candidate's call (inputs,
    run, hand-over), the relay of byte payloads, the reference's comparison; a timed call's kept
    output, the reference's only. The parts sum to no more than the correctness stage."""
    solution = BENCHMARKS / "solutions" / "level1" / "1_relu.py"
    result = cpu_evaluator.evaluate(BENCHMARKS / "level1" / "1_relu.py", read(solution), CONFIG)
    assert result.status == Status.CORRECT, result.feedback()
    checks = [t for t in result.trials if not t.name.startswith("timed call")]
    assert [t.name for t in checks[:2]] == ["trial 0", "trial 1"] and checks[-1].name == "post-timing check"
    for trial in checks:
        assert set(trial.seconds) == {"candidate", "relay", "reference"}, trial
        assert all(isinstance(v, float) and 0 <= v < 60 for v in trial.seconds.values()), trial
        assert trial.seconds["candidate"] > 0 and trial.seconds["reference"] > 0, trial
    timed = [t for t in result.trials if t.name.startswith("timed call")]
    assert timed and all(set(t.seconds) == {"reference"} for t in timed)
    before_timing = [t for t in checks if t.name != "post-timing check"]
    assert sum(sum(t.seconds.values()) for t in before_timing) <= result.stage_seconds["correctness"] + 0.05


def test_bench_throughput_profiles_host_time_before_and_after(tmp_path):
    """bench_throughput.py --compare on two CPU workers (the pipeline only: CPU timings mean
    nothing): untuned, the two samples of one problem run at once and both time its baselines;
    tuned, one waits for the other's. Every row carries the host-time profile."""
    import json
    import subprocess
    import sys

    out = tmp_path / "throughput.json"
    import os

    # Servers started by the bench itself (not forked from the test session's zygote), so that the
    # per-kind sampler sees them below the bench's process.
    env = {k: v for k, v in os.environ.items() if k != "KERNELAGENT_SERVER_ZYGOTE"}
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "bench_throughput.py"), "--gpu-sets", "cpu:2",
                           "--filter", "level1/1_relu", "--samples", "2", "--trials", "1", "--compare",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["host_tuning"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {False, True}
    for row in rows.values():
        assert row["evaluations"] == 2 and row["correct_samples"] == 2, row
        profile = row["host_profile"]
        assert profile["harness_cpu_s"] > 0 and profile["stage_seconds_sum"]["server_cpu"] > 0
        assert {"server_start", "compile", "correctness", "timing", "total"} <= set(profile["stage_seconds_sum"])
        assert profile["stage_seconds_sum"]["server_start"] > 0 and profile["store_s"] > 0
        # issue 39: what each evaluation cost (bench/cost.py), and the host's CPU meanwhile
        cost = row["cost"]
        assert cost["evaluations"] == 2 and cost["evaluations_per_device_minute"] > 0
        assert cost["host_cpu_s_per_evaluation"] > 0 and {"candidate", "reference", "server"} <= set(
            cost["host_cpu_s_by_part"])
        assert cost["slot_held_s"] > 0 and 0 < cost["slot_busy_share"] and "slot_loop_s" in cost["slot_parts_s"]
        assert row["machine_cpu_s_per_evaluation"] > 0
        # issue 44: where the host's CPU went, by process kind, sampled below the bench
        kinds = row["host_cpu"]["by_kind"]
        assert {"server", "reference", "candidate"} <= set(kinds), kinds
        assert all(kinds[k]["cpu_s"] > 0 for k in ("server", "reference", "candidate")), kinds
        assert row["host_cpu"]["sampled_cpu_s_per_evaluation"] > 0
    assert rows[False]["host_profile"]["baselines_timed"] == 2
    assert rows[True]["host_profile"]["baselines_timed"] == 1
    assert "CPU per evaluation" in proc.stdout and "by kind" in proc.stdout
    # each kind's CPU-seconds and how many processes it had (ncu's count: sessions started)
    import re

    assert re.search(r"by kind server [0-9.]+ s/[1-9][0-9]*p", proc.stdout), proc.stdout[-2000:]
    for row in rows.values():  # no Nsight Compute on the CPU
        assert row["host_profile"]["evidence_sessions"] == {"evaluations_with_evidence": 0, "from_spares": 0}
        assert row["audits"] == 0
    assert "audits (results Nsight Compute ran on): 0" in proc.stdout
    # One was deferred to the other's baselines (the key exists only then); how long it waited
    # depends on which finished first, so it may round to zero.
    assert rows[True]["host_profile"]["stage_seconds_sum"]["baseline_wait"] >= 0


def test_bench_throughput_counts_evidence_sessions_and_spares():
    """Issue 44: how many evaluations had an Nsight Compute session and how many took over a
    spare started ahead (a spare no job takes is host CPU spent for nothing)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_throughput_t", BENCHMARKS / "bench_throughput.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    results = [{"kernel_evidence": {"phases": {"spare": True}}}, {"kernel_evidence": {"phases": {"spare": False}}},
               {"kernel_evidence": {"phases": {}}}, {"kernel_evidence": None}, {}]
    assert mod._evidence_sessions(results) == {"evaluations_with_evidence": 3, "from_spares": 1}


def _bench_throughput():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_throughput_t2", BENCHMARKS / "bench_throughput.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_throughput_timeline_and_evidence_by_problem():
    """Issue 44: when each evaluation ran (the fill and the drain that more GPUs do not shorten)
    and, per problem, ncu's kernel time per call against the harness's, so that two rows (one GPU,
    two GPUs profiling at once) can be compared."""
    mod = _bench_throughput()

    def result(problem, ncu, harness, held, evidence_held, wait=0.0, flags=()):
        return {"problem": f"/x/level1/{problem}.py", "stage_seconds": {"baseline_wait": wait},
                "concurrency": {"held_s": held, "evidence_slot": {"held_s": evidence_held}},
                "kernel_evidence": {"per_call_ms": ncu, "ncu_lock": "device"},
                "timings": {"candidate": {"median_ms": harness}},
                "flags": [{"kind": k, "severity": "review"} for k in flags]}

    results = [{**result("1_relu", 0.2, 0.21, 1.0, 2.0), "fingerprint": {"uuid": "GPU-0123-abcdef"}},
               result("1_relu", 0.3, 0.23, 1.5, 2.5, wait=4.0),
               result("1_relu", 0.1, 0.22, 1.0, 2.0, flags=("kernel-evidence",)),
               result("2_gelu", 1.0, 1.1, 0.5, 0.5)]
    ends = [("cuda:0", 10.0, 1010.0), ("cuda:1", 5.0, 1012.0), ("cuda:0", 3.0, 1020.0), ("cuda:1", 30.0, 1031.0)]
    line = mod.timeline(results, ends, 1000.0)
    assert [s[2] for s in line["spans"]] == [0.0, 1.0, 7.0, 17.0]  # by start
    assert line["spans"][0][:6] == ["cuda:0 abcdef", "1_relu", 0.0, 10.0, 3.0, 0.0]
    assert line["spans"][2][:6] == ["cuda:1", "1_relu", 7.0, 12.0, 4.0, 4.0]
    assert line["spans"][2][6] == {"baseline_wait": 4.0} and line["spans"][2][7] is False
    assert (line["first_end_s"], line["last_start_s"], line["end_s"]) == (10.0, 17.0, 31.0)
    assert line["completion_s_per_evaluation"] == 7.0  # (31 - 10) / 3
    # one start after the first end (17 s): too few for a steady-state rate
    assert line["steady_starts"] == 1 and line["steady_s_per_evaluation"] is None
    more = mod.timeline(results + [result("2_gelu", 1.0, 1.1, 0.5, 0.5)], ends + [("cuda:0", 4.0, 1026.0)], 1000.0)
    assert more["steady_starts"] == 2 and more["steady_s_per_evaluation"] == 6.0  # (22 - 10) / 2
    results[3]["concurrency"]["retried_alone"] = True  # the last to end, re-run alone
    line = mod.timeline(results, ends, 1000.0)
    assert line["spans"][1][7] is True and line["completion_s_per_first_try"] == 5.0  # (20 - 10) / 2
    assert line["baselines_jobs"] == []  # none of these started one
    # the first evaluation of each problem starts its baselines' job: the fill's first results wait for it
    results[0]["concurrency"]["baselines_job"] = {"span": [1001.0, 1009.5],
                                                  "stage_seconds": {"baselines_compile": 3.25},
                                                  "slot": {"wait_s": 4.5, "held_s": 0.75}}
    results[3]["concurrency"]["baselines_job"] = {"span": [1000.5, 1030.0], "stage_seconds": {}, "slot": {}}
    results[1]["concurrency"]["baselines_job"] = {"span": "not a span"}  # a malformed one is left out
    line = mod.timeline(results, ends, 1000.0)
    assert line["baselines_jobs"] == [["2_gelu", 0.5, 30.0, 0.0, 0.0, 0.0], ["1_relu", 1.0, 9.5, 3.25, 4.5, 0.75]]
    by = mod.evidence_by_problem(results)
    assert by["1_relu"] == {"ncu_ms": 0.2, "ncu_n": 3, "harness_ms": 0.22, "evidence_flags": 1, "ncu_lock": ["device"]}
    assert by["2_gelu"]["ncu_ms"] == 1.0 and by["2_gelu"]["evidence_flags"] == 0
    other = {"evidence_by_problem": {"1_relu": {"ncu_ms": 0.21}, "2_gelu": {"ncu_ms": 0.9}}}
    gaps = mod.evidence_agreement({"evidence_by_problem": by}, other)
    assert gaps == {"gaps_pct": {"1_relu": 5.0, "2_gelu": -10.0}, "largest_pct": 10.0}


def test_bench_throughput_lists_what_the_evaluations_re_run_alone_met():
    """Issue 44: one evaluation re-run alone after a 104 s first try held a two-GPU batch's end
    for 57 s (H100 x2, 2026-11-28); its first try's stage and reason go in the row."""
    mod = _bench_throughput()
    first = {"status": "harness_error", "stage": "start", "reason": "ran past a stage limit ...",
             "stage_seconds": {"start": 61.0, "total_server": 104.3, "not_a_stage": 1.0},
             "concurrency": {}}
    results = [{"problem": "/x/level1/6_layernorm.py", "status": "correct",
                "concurrency": {"retried_alone": True, "first_try": first}},
               {"problem": "/x/level1/1_relu.py", "status": "correct", "concurrency": {"first_try": first}},
               {"problem": "/x/level1/2_gelu.py", "status": "correct", "concurrency": {}}]
    out = mod.retried(results)
    assert [r["problem"] for r in out] == ["6_layernorm"]
    assert out[0]["first_try"]["stage"] == "start"
    assert out[0]["first_try"]["stage_seconds"] == {"start": 61.0, "total_server": 104.3}


def test_servers_are_pinned_to_cpu_shares_unless_told_not_to():
    from kernelagent.harness.caller.pool import EvaluatorPool

    with EvaluatorPool(devices=["cpu", "cpu"]) as pinned, \
            EvaluatorPool(devices=["cpu", "cpu"], pin_cpus=False) as unpinned:
        shares = [e.cpus for e in pinned.evaluators]
        assert all(unpinned_cpus is None for unpinned_cpus in (e.cpus for e in unpinned.evaluators))
    import os

    if len(os.sched_getaffinity(0)) >= 2:
        assert all(shares) and not set(shares[0]) & set(shares[1])


def test_search_wall_runs_the_three_searches_against_the_scripted_server(tmp_path):
    """benchmarks/search_wall.py (issue 26's GPU report) on the CPU: the pipeline only. Each run
    stops at its first correct kernel here (a speed target cannot be measured on the CPU), so
    only the shape of the report is checked; the wall times are for a GPU."""
    import json
    import subprocess
    import sys

    out = tmp_path / "wall.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "search_wall.py"), "--latency", "0", "--device", "cpu",
                           "--out", str(out)], capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "KERNELAGENT_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["run"] for r in rows] == ["best-of-n --samples 4", "best-of-n --samples 1", "single"]
    assert all(r["exit"] == 0 and r["model_calls"] >= 1 and r["evaluations"] >= 1 for r in rows)
    assert rows[0]["model_calls"] == 4 and rows[0]["search"]["size"]["nodes"] == 4  # one round of four at once


def test_trace_cost_judges_each_solution_by_the_issues_bounds():
    """Issue 55: benchmarks/trace_cost.py's per-solution summary (traced against untraced copies
    of one candidate in one server) and the bound it is held to: 1% at 50 us or more, 3% below."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("trace_cost_t", BENCHMARKS / "trace_cost.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert [key for key, _, _ in mod.solutions("level1/[1-3]_*")] == ["level1/1_relu", "level1/2_gelu",
                                                                       "level1/3_add_mul_bf16"]

    def row(traced, median, start=1.0):
        return {"traced": traced, "status": "correct", "median_ms": median, "start_s": start, "compile_s": 0.5,
                "evidence_source": "trace" if traced else None}

    long_ok = mod.summarise("a", [row(True, 0.1008), row(True, 0.1010), row(True, 0.2), row(False, 0.1),
                                   row(False, 0.1001), row(False, 0.0999)])
    assert long_ok["traced"]["median_ms"] == 0.101 and long_ok["untraced"]["median_ms"] == 0.1
    assert long_ok["difference_pct"] == 1.0 and long_ok["bound_pct"] == 1.0 and long_ok["within"]
    long_missed = mod.summarise("b", [row(True, 0.1015), row(False, 0.1)])
    assert long_missed["difference_pct"] == 1.5 and not long_missed["within"]
    short = mod.summarise("c", [row(True, 0.0103, start=1.4), row(False, 0.0100)])
    assert short["bound_pct"] == 3.0 and short["within"] and short["traced"]["start_s"] == 1.4
    failed = mod.summarise("d", [{**row(True, None), "status": "runtime_error"}, row(False, 0.1)])
    assert failed["difference_pct"] is None and not failed["within"]


def test_bench_throughput_counts_each_rows_audits():
    """Issue 59: a row's audits (results with Nsight Compute's time) are printed beside the
    scaling, since a problem about as fast as Inductor is a counted win, so audited, in one row
    and not the next."""
    mod = _bench_throughput()
    results = [{"problem": "/x/level1/5_softmax.py", "kernel_evidence": {"per_call_ms": 0.13}},
               {"problem": "/x/level1/5_softmax.py", "kernel_evidence": {"per_call_ms": 0.12}},
               {"problem": "/x/level1/1_relu.py", "kernel_evidence": {"source": "trace"}},
               {"problem": "/x/level1/2_gelu.py", "kernel_evidence": {"per_call_ms": 0.07}}]
    by_problem = mod.evidence_by_problem(results)
    assert {k: v["ncu_n"] for k, v in by_problem.items()} == {"1_relu": 0, "2_gelu": 1, "5_softmax": 2}
    assert mod.audits_of(by_problem) == 3


def test_bench_throughput_counts_each_rows_calibrations_and_slot_per_evaluation():
    """Issue 59: calibrations measured in the slot, measured again (or another server's second
    measure taken), read from another server, and loops on another server's plan, per row; the slot per evaluation with and without the evidence
    sessions' holds."""
    mod = _bench_throughput()
    results = [{"timed_loop": {"calibration_s": 0.6, "calibration_reused": False}},
               {"timed_loop": {"calibration_s": 0.6, "calibration_reused": False, "calibrations_s": [0.62, 0.6]}},
               {"timed_loop": {"calibration_s": 0.6, "calibration_reused": True, "calibration_shared": True,
                               "plan_shared": True}},
               {"timed_loop": {"calibration_s": 0.6, "calibration_reused": True, "calibrations_s": [0.62, 0.6],
                               "recalibration_shared": True}},
               {"timed_loop": {"calibration_s": None}}, {"timed_loop": {}}, {}]
    assert mod.calibrations_of(results) == {"loops": 4, "measured": 2, "measured_again": 1, "again_another_servers": 1,
                                            "another_servers": 1, "plans_another_servers": 1}
    cost = {"slot_held_s": 161.48, "slot_parts_s": {"evidence_s": 47.33, "slot_loop_s": 43.65}}
    assert mod.slot_per_evaluation(cost, 96) == {"all_s": 1.682, "without_evidence_s": 1.189}
    assert mod.slot_per_evaluation({}, 0) == {"all_s": 0.0, "without_evidence_s": 0.0}


def _row(gpus: str, wall: float, *, tuning: bool = True, pinned: bool = True, audits: int = 3) -> dict:
    n = int(gpus.split(":")[1]) if gpus.startswith("cpu:") else len(gpus.split(","))
    return {"gpus": gpus, "n_gpus": n, "host_tuning": tuning, "pinned": pinned, "wall_s": wall, "audits": audits,
            "evidence_by_problem": {}, "timeline": {"completion_s_per_first_try": wall / 40,
                                                    "steady_s_per_evaluation": wall / 50, "first_end_s": 10.0 + n}}


@pytest.mark.parametrize("rows,expect", [
    # issue 59 asks 1 -> 2 and 1 -> 4 GPUs of one call: each many-device row against the one-device row
    ([_row("0", 120.0), _row("0,1", 64.0), _row("0,1,2,3", 33.0)],
     {"scaling_1_to_2": (2, 1.875, 0.938), "scaling_1_to_4": (4, 3.636, 0.909)}),
    # an unpinned row is compared as unpinned; an untuned pair only with its own one-device row
    ([_row("0", 120.0), _row("0,1", 80.0), _row("0,1", 60.0, pinned=False),
      _row("0", 150.0, tuning=False, pinned=False), _row("0,1", 100.0, tuning=False, pinned=False)],
     {"scaling_1_to_2": (2, 1.5, 0.75), "scaling_1_to_2_unpinned": (2, 2.0, 1.0),
      "scaling_1_to_2_untuned": (2, 1.5, 0.75)}),
    # CPU workers are never compared with GPUs; no one-device row, no scaling
    ([_row("cpu:1", 30.0), _row("0,1", 10.0), _row("cpu:2", 20.0)], {"scaling_1_to_2": (2, 1.5, 0.75)}),
    ([_row("0,1", 64.0), _row("0,1,2,3", 33.0)], {}),
])
def test_bench_throughput_scales_every_many_device_row_against_one_device(rows, expect):
    mod = _bench_throughput()
    got = mod.scalings(rows)
    assert {k: (v["devices"], v["speedup"], v["efficiency"]) for k, v in got.items()} == expect
    for scale in got.values():
        n = scale["devices"]
        assert scale["first_results_s"] == [11.0, 10.0 + n] and scale["audits"] == [3, 3]
        assert scale["after_the_fill"] == scale["steady_state"] == scale["speedup"]


def test_bench_throughput_seeds_a_rows_cache_with_baselines_entries_only(tmp_path):
    """--baselines shared: a row's fresh cache starts with the warm-up's baselines' entries and
    nothing else of its cache (no lock, no calibration, no compile cache)."""
    mod = _bench_throughput()
    warm = tmp_path / "cache-warm"
    (warm / "baselines").mkdir(parents=True)
    (warm / "baselines" / "a1.json").write_text('{"timings": {}}')
    (warm / "baselines" / "a1.lock").write_text("")
    (warm / "calibration").mkdir()
    (warm / "calibration" / "c.json").write_text("{}")
    row = tmp_path / "cache-0"
    assert mod.seed_baselines(warm, row) == 1
    assert sorted(str(p.relative_to(row)) for p in row.rglob("*")) == ["baselines", "baselines/a1.json"]


def test_bench_throughput_shared_baselines_are_timed_once_for_every_row(tmp_path):
    """bench_throughput.py --baselines shared on one and two CPU workers (the pipeline only): the
    warm-up times the problem's baselines once; neither row times them, each reads them cached for
    every evaluation, and the two-worker row is compared with the one-worker row. --baselines-dir
    keeps the warm-up's entries, and a later call (the next rows of one measurement) reads them."""
    import json
    import os
    import subprocess
    import sys

    out, kept = tmp_path / "throughput.json", tmp_path / "kept"
    env = {k: v for k, v in os.environ.items() if k != "KERNELAGENT_SERVER_ZYGOTE"}

    def bench(*sets: str, samples: int, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, str(BENCHMARKS / "bench_throughput.py"), "--gpu-sets", *sets,
                               "--filter", "level1/1_relu", "--samples", str(samples), "--trials", "1",
                               "--baselines", "shared", "--baselines-dir", str(kept), "--out", str(out), *extra],
                              capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc

    proc = bench("cpu:1", "cpu:2", samples=2)
    result = json.loads(out.read_text())
    assert result["baselines_warmup"]["evaluations"] == 1 and result["baselines_warmup"]["baselines_timed"] == 1
    assert result["baselines_warmup"]["entries"] >= 1 and result["baselines_warmup"]["kept_in"] == str(kept)
    assert len(list((kept / "baselines").glob("*.json"))) == result["baselines_warmup"]["entries"]
    digest = result["baselines_warmup"]["digest"]
    assert [r["gpus"] for r in result["rows"]] == ["cpu:1", "cpu:2"]
    for row in result["rows"]:
        assert row["jobs_per_gpu"] == "the server's default"
        assert row["correct_samples"] == 2 and row["baselines_seeded"] == result["baselines_warmup"]["entries"], row
        assert row["host_profile"]["baselines_timed"] == 0 and row["host_profile"]["baselines_cached"] == 2, row
    assert result["scaling_1_to_2"]["devices"] == 2 and result["scaling_1_to_2"]["speedup"] > 0
    assert "baselines: shared, timed once" in proc.stdout and "1 -> 2 GPUs" in proc.stdout
    assert "per device, jobs started after the first result" in proc.stdout
    for row in result["rows"]:  # on the CPU every loop measures its own (no plan reused, no store)
        assert row["calibrations"]["loops"] == 2 and row["calibrations"]["another_servers"] == 0, row["calibrations"]
        assert row["slot_per_evaluation"]["all_s"] >= row["slot_per_evaluation"]["without_evidence_s"] > 0
    assert "calibrations of 2 loops: 2 measured" in proc.stdout
    # the next call of the measurement reads the kept entries: no warm-up, nothing timed
    proc = bench("cpu:1", samples=1, extra=("--jobs-per-gpu", "2"))
    result = json.loads(out.read_text())
    assert result["rows"][0]["jobs_per_gpu"] == 2
    assert result["baselines_warmup"] == {"from": str(kept), "entries": len(list((kept / "baselines").glob("*.json"))),
                                          "digest": digest}  # the same entries the first call's rows read
    assert result["rows"][0]["host_profile"]["baselines_timed"] == 0, result["rows"][0]["host_profile"]
    assert result["rows"][0]["host_profile"]["baselines_cached"] == 1 and "read from" in proc.stdout


def test_bench_throughput_compares_each_devices_steady_jobs_by_stage():
    """Issue 59: one GPU's server was the slower of two in three readings (latency 20.9 s against
    14.6 s), unexplained: each device's jobs started after the first result (the cold first wave
    and those re-run alone left out) are averaged by latency, slot and stage, so the next reading
    says whether the driver (start), the host (compile, correctness) or the GPU (timing) differs."""
    mod = _bench_throughput()
    # [device, problem, start, end, slot, baseline wait, stage clocks, re-run alone]
    spans = [["cuda:0", "1_relu", 0.0, 10.0, 1.0, 0.0, {"start": 9.0}, False],  # the first wave
             ["cuda:1", "1_relu", 0.5, 12.0, 1.0, 0.0, {"start": 9.0}, False],
             ["cuda:0", "2_gelu", 10.5, 20.5, 1.0, 0.0, {"start": 1.0, "compile": 2.0, "timing": 1.0}, False],
             ["cuda:0", "2_gelu", 11.0, 17.0, 2.0, 0.0, {"start": 2.0, "compile": 3.0}, False],
             ["cuda:1", "5_softmax", 12.5, 32.5, 1.5, 0.0, {"start": 4.0, "correctness": 6.0}, False],
             ["cuda:1", "5_softmax", 13.0, 90.0, 9.0, 0.0, {"start": 60.0}, True]]  # re-run alone
    got = mod.per_device(spans, first_end=10.0)
    assert got == {"cuda:0": {"jobs": 2, "latency_s": 8.0, "slot_s": 1.5,
                              "stages_s": {"start": 1.5, "compile": 2.5, "timing": 0.5}},
                   "cuda:1": {"jobs": 1, "latency_s": 20.0, "slot_s": 1.5,
                              "stages_s": {"start": 4.0, "correctness": 6.0}}}
    assert mod.per_device(spans[:2], first_end=10.0) == {}


def test_bench_throughput_joins_rows_of_consecutive_calls(tmp_path, capsys):
    """Issue 59: rows that do not fit one device call (one GPU, then four) are measured in
    consecutive calls with one kept set of baselines and compared by --join; outputs of other
    candidates are refused, and rows that read different baselines are said to."""
    import json

    mod = _bench_throughput()
    kept = {"from": "/k", "entries": 6, "digest": "d1"}
    one, four = tmp_path / "one.json", tmp_path / "four.json"
    one.write_text(json.dumps({"candidates": 132, "samples": 22, "filter": "f", "baselines_warmup": kept,
                               "rows": [_row("0", 330.0)]}))
    four.write_text(json.dumps({"candidates": 132, "samples": 22, "filter": "f", "baselines_warmup": kept,
                                "rows": [_row("0,1", 170.0), _row("0,1,2,3", 90.0)]}))
    out = tmp_path / "joined.json"
    mod.join([str(one), str(four)], str(out))
    joined = json.loads(out.read_text())
    assert [r["gpus"] for r in joined["rows"]] == ["0", "0,1", "0,1,2,3"]
    assert joined["scaling_1_to_2"]["speedup"] == 1.941 and joined["scaling_1_to_4"]["speedup"] == 3.667
    printed = capsys.readouterr().out
    assert "1 -> 4 GPUs" in printed and "compare with care" not in printed
    four.write_text(json.dumps({"candidates": 132, "samples": 22, "filter": "f",
                                "baselines_warmup": {"gpus": "0,1", "entries": 6, "digest": "d2"},  # timed again
                                "rows": [_row("0,1,2,3", 90.0)]}))
    mod.join([str(one), str(four)], str(out))
    assert "did not all read the same kept baselines" in capsys.readouterr().out
    four.write_text(json.dumps({"candidates": 48, "samples": 8, "filter": "f", "rows": [_row("0,1,2,3", 30.0)]}))
    with pytest.raises(SystemExit, match="not of the same candidates"):
        mod.join([str(one), str(four)], str(out))
