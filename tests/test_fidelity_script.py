"""benchmarks/fidelity.py on the CPU: the end-to-end run (fresh `kernelagent eval` processes, the
baseline cache on and off), its JSONL rows and Markdown summary, resuming, bad input, and the
statistics on synthetic rows."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "fidelity.py"
PAIR = f"{ROOT / 'tests/candidates/relu_problem.py'}:{ROOT / 'tests/candidates/relu_good.py'}"


def load_script():
    spec = importlib.util.spec_from_file_location("fidelity_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the script's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def fidelity(cwd: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


# One worker under pytest-xdist: cpu_run (a real run of the script) is paid once.
pytestmark = pytest.mark.xdist_group("fidelity_script")


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """One real run: 1 pair, 2 repetitions, cache on and off (5 evaluations with the prime)."""
    cwd = tmp_path_factory.mktemp("fidelity")
    proc = fidelity(cwd, "--reps", "2", "--pair", PAIR, "--device", "cpu", "--out", "rows.jsonl",
                    "--summary", "summary.md")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (cwd / "rows.jsonl").read_text().splitlines()]
    return cwd, proc, rows


def test_rows_one_per_evaluation_with_cache_on_and_off(cpu_run):
    cwd, _, rows = cpu_run
    keys = [(r["cache"], r["rep"], r["prime"]) for r in rows]
    assert sorted(keys) == [("off", 1, False), ("off", 2, False), ("on", 0, True), ("on", 1, False), ("on", 2, False)]
    assert keys[0] == ("on", 0, True)  # the prime fills the shared cache before the counted repetitions
    # the warm repetitions (2) before the fresh-process ones (1): a capped run keeps the warm spread
    assert [r["rep"] for r in rows[1:]] == [2, 2, 1, 1]
    # repetition 1 (--fresh 1, the default) in a fresh `kernelagent eval` process; the prime and
    # repetition 2 in the one warm server
    assert {(r["rep"], r["process"]) for r in rows} == {(0, "warm"), (1, "fresh"), (2, "warm")}
    for row in rows:
        assert row["label"] == "relu_problem" and row["status"] == "correct" and row["rc"] == 0
        assert row["device"] == "cpu" and row["meaningful"] is False
        assert row["candidate_ms"] > 0 and row["eager_ms"] > 0 and row["speedup_eager"] > 0
        assert row["compile_ms"] is None  # the harness skips Inductor on the CPU
        low, high = row["interval_eager"]
        assert low <= high
        assert row["source"] in ("in-process", "server")
        loop = row["timed_loop"]
        server, claimed = loop["server_ms_per_call"], loop["claimed_mean_ms"]
        assert claimed > 0 and server is not None and server >= 0, loop
        # no ratio where the server's time less the calibration is 0 (a loaded CI CPU: the
        # calibration's noise can exceed a ReLU loop's own time); otherwise the two clocks' ratio
        assert loop["ratio"] == (pytest.approx(server / claimed) if server else None), loop
        assert row["n_samples"] >= 4 and row["drift_q4_q1"] > 0
        assert row["clocks_before"] is None and row["clocks_after"] is None  # no nvidia-smi here
        # where the time went: the harness's stage clocks and what sharing the device cost
        assert row["stage_seconds"]["total_server"] > 0, row["stage_seconds"]
        assert "shared_device" in row["concurrency"] and set(row["concurrency"]) <= set(load_script().CONCURRENCY_KEYS)
    # shared cache: the counted 'on' repetitions reuse the prime's baselines; 'off' never finds any
    assert [r["baselines_cached"] for r in rows if r["cache"] == "on"] == [False, True, True]
    assert [r["baselines_cached"] for r in rows if r["cache"] == "off"] == [False, False]
    on = [r["eager_ms"] for r in rows if r["cache"] == "on"]
    assert on[1] == on[2] == on[0]  # the same cached number, not a new timing
    work = cwd / "rows.jsonl.work"  # next to --out, wherever the evals themselves run
    assert any((work / "cache-on" / "baselines").iterdir())
    assert not list(work.glob("cache-off-*"))  # each fresh 'off' cache is removed after its evaluation


def test_summary_table_and_not_meaningful_label(cpu_run):
    cwd, proc, rows = cpu_run
    summary = (cwd / "summary.md").read_text()
    assert summary in proc.stdout  # the same Markdown on stdout and in --summary
    assert "NOT MEANINGFUL" in summary and "Triton interpreter" in summary
    assert "nvidia-smi not found" in summary
    table = [line for line in summary.splitlines() if line.startswith("| relu_problem |")]
    assert len(table) == 4  # warm and fresh apart, per cache setting
    cells = {tuple(line.split(" | ")[1:3]): line.split(" | ") for line in table}
    assert set(cells) == {("on", "warm"), ("on", "fresh"), ("off", "warm"), ("off", "fresh")}
    assert all(c[3] == "1/1" for c in cells.values())
    assert cells["on", "warm"][-2] == "1/1" and cells["on", "fresh"][-2] == "1/1"  # cached column
    assert cells["off", "warm"][-2] == "0/1" and cells["off", "fresh"][-2] == "0/1"
    # fresh/warm: repetition 1's speedup over repetition 2's (one fresh process, one warm server)
    on = {r["process"]: r["speedup_eager"] for r in rows if r["cache"] == "on" and not r["prime"]}
    for process in ("warm", "fresh"):
        assert cells["on", process][-1].rstrip(" |") == f"{on['fresh'] / on['warm']:.3f}"
    assert "CV x Ind" in summary and "<= 1%" in summary and "<= 3%" in summary
    assert "n/a" in summary and "MISS" not in summary  # no target judged on the CPU
    # one repetition per process: no CV is made up
    assert all(c[5] == "—" for c in cells.values())


def test_resume_adds_nothing_and_existing_out_is_refused(cpu_run):
    cwd, _, rows = cpu_run
    again = fidelity(cwd, "--reps", "2", "--pair", PAIR, "--device", "cpu", "--out", "rows.jsonl")
    assert again.returncode == 2
    assert again.stderr.strip().count("\n") == 0 and "--resume" in again.stderr
    resumed = fidelity(cwd, "--reps", "2", "--pair", PAIR, "--device", "cpu", "--out", "rows.jsonl", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "5 evaluations planned, 5 already in" in resumed.stdout
    assert len((cwd / "rows.jsonl").read_text().splitlines()) == len(rows)
    assert "| relu_problem | off | warm | 1/1 |" in resumed.stdout
    assert "| relu_problem | off | fresh | 1/1 |" in resumed.stdout


@pytest.mark.parametrize("pair, message", [
    ("nope.py:also_nope.py", "no such file"),
    ("just_one_path.py", "expected PROBLEM:CANDIDATE"),
    (PAIR + "@batch_size=big", "not name=number"),
    (PAIR + "@no_such_global=3", "no module-level no_such_global"),
])
def test_bad_pair_is_one_line_exit_2(tmp_path, pair, message):
    proc = fidelity(tmp_path, "--pair", pair, "--out", "x.jsonl", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and message in proc.stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_size_override_writes_a_resized_copy(tmp_path):
    fid = load_script()
    pair = fid.parse_pair(PAIR + "@batch_size=8,dim=128")
    assert pair.overrides == {"batch_size": 8, "dim": 128} and pair.label == "relu_problem@batch_size=8,dim=128"
    path = fid.problem_file(pair, tmp_path)
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    assert tuple(namespace["get_inputs"]()[0].shape) == (8, 128)


def synthetic(cand_ms: float, speedups: list[float], meaningful: bool = True, process: str = "warm") -> list[dict]:
    return [{"label": "p", "cache": "off", "rep": i + 1, "prime": False, "status": "correct", "process": process,
             "candidate_ms": cand_ms, "eager_ms": 2 * cand_ms, "compile_ms": s * cand_ms,
             "speedup_compile": s, "speedup_eager": 2.0, "interval_compile": [s - 0.02, s + 0.02],
             "interval_eager": [1.9, 2.1], "drift_q4_q1": d, "source": "in-process",
             "timed_loop": {"ratio": 1.0}, "baselines_cached": False, "meaningful": meaningful,
             "clocks_before": {"clocks.sm": 1980.0, "clocks.max.sm": 1980.0, "temperature.gpu": 40.0, "power.draw": 100.0},
             "clocks_after": {"clocks.sm": 1755.0, "clocks.max.sm": 1980.0, "temperature.gpu": 55.0, "power.draw": 400.0}}
            for i, (s, d) in enumerate(zip(speedups, [1.0, 1.08, 0.99, 1.01]))]


def test_targets_by_kernel_size_on_synthetic_rows():
    fid = load_script()
    speedups = [1.00, 1.02, 1.00, 1.02]  # CV 1.14%: misses the 1% target, meets the 3% one
    big = fid.summarize(synthetic(0.2, speedups), reps=4)[0]
    small = fid.summarize(synthetic(0.01, speedups), reps=4)[0]
    assert big["cv_speedup_compile"] == pytest.approx(0.01143, abs=1e-5)
    assert (big["target"], big["verdict"]) == (0.01, "MISS")
    assert (small["target"], small["verdict"]) == (0.03, "ok")
    assert big["cv_candidate"] == 0.0 and big["speedup_compile"] == pytest.approx(1.01)
    assert big["drift_q4_q1_worst"] == 1.08 and big["drift_q4_q1"] == pytest.approx(1.005)
    assert big["interval_covers"] == 4 and big["interval"] == [pytest.approx(0.99), pytest.approx(1.03)]
    assert big["sm_mhz"] == (1755.0, 1980.0) and big["temp_c"] == (40.0, 55.0)
    cpu = fid.summarize(synthetic(0.2, speedups, meaningful=False), reps=4)[0]
    assert cpu["verdict"] == "n/a"
    header = {"device": "H100", "torch": "x", "torch_cuda": "12", "triton": "y", "python": "3",
              "driver": "d", "clocks": "nvidia-smi, before and after each repetition", "reps": 4, "note": "", "notes": []}
    text = fid.render([big, small], [], header)
    assert "NOT MEANINGFUL" not in text and "<= 1%: MISS" in text and "<= 3%: ok" in text
    assert "| p | off | warm | 1755-1980 | 1980-1980 | 40-55 | 100.0-400.0 |" in text
    assert "Target met for 1 of 2" in text
    # Only primes ran (a capped H100 run): nothing counted, and nothing said about the device.
    capped = fid.render([], [], header)
    assert "No counted repetition finished" in capped and "NOT MEANINGFUL" not in capped


def test_warm_and_fresh_spreads_are_judged_apart():
    """Scope 3 of issue 42: the CV in one warm server and the CV across fresh processes, each
    against the target; a steady warm server does not hide fresh processes that vary."""
    fid = load_script()
    warm = synthetic(0.2, [1.00, 1.001, 1.00, 1.001])
    fresh = [dict(r, rep=r["rep"] + 4) for r in synthetic(0.2, [1.00, 1.05, 0.97, 1.04], process="fresh")]
    summary = {s["process"]: s for s in fid.summarize(warm + fresh, reps=8)}
    assert set(summary) == {"warm", "fresh"}
    assert summary["warm"]["verdict"] == "ok" and summary["fresh"]["verdict"] == "MISS"
    assert summary["warm"]["n_ok"] == summary["fresh"]["n_ok"] == 4
    assert summary["fresh"]["fresh_over_warm"] == pytest.approx(1.015 / 1.0005)
    mixed = fid.summarize([dict(r, process="warm") for r in warm + fresh], reps=8)[0]
    assert mixed["verdict"] == "MISS" and mixed["n_ok"] == 8  # the same rows, not split: one CV
    header = {"device": "H100", "torch": "x", "torch_cuda": "12", "triton": "y", "python": "3",
              "driver": "d", "clocks": "nvidia-smi, before and after each repetition", "reps": 8, "note": "", "notes": []}
    text = fid.render(list(summary.values()), [], header)
    assert "Target met for 1 of 2 problem/cache/process settings." in text
    assert "- warm (one warm server): met for 1 of 1" in text
    assert "- fresh (a fresh process each): met for 0 of 1" in text


def test_quarter_drift_and_cv():
    fid = load_script()
    assert fid.quarter_drift([1, 1, 2, 2, 2, 2, 3, 3]) == 3.0
    assert fid.quarter_drift([1, 2, 3]) is None
    assert fid.cv([1.0]) is None and fid.cv([2.0, 2.0]) == 0.0
    assert fid.cv([1.0, 3.0]) == pytest.approx(2 ** 0.5 / 2)


def _fake_eval(walls: list[float]):
    """A stand-in for run_eval: a correct CPU-like result, each call taking walls[i] 'seconds'."""
    calls = []
    evidences = []

    def run_eval(problem, candidate, cache_dir, device, timeout, evidence=None):
        calls.append(timeout)
        evidences.append(evidence)
        data = {"status": "correct", "device": "cpu", "timings": {"candidate": {"median_ms": 1.0, "samples_ms": [1.0] * 8,
                                                                                "meaningful": False}},
                "speedups": {}, "speedup_intervals": {}, "baselines_cached": False}
        return 0, data, "", walls[min(len(calls) - 1, len(walls) - 1)]

    run_eval.evidences = evidences
    return run_eval, calls


class InFlight:
    """Stand-ins for run_eval and run_eval_warm that each take `seconds` and record which calls were
    in flight together (`seen`: the keys running as each call started)."""

    def __init__(self, seconds: float):
        import threading

        self.inner, _ = _fake_eval([0.01])
        self.seconds, self.lock, self.running, self.seen = seconds, threading.Lock(), [], []

    def stand_in(self, key):
        """A stand-in recording key(args) for each call."""
        import time as real_time

        def run(*args, **kwargs):
            entry = key(args)
            with self.lock:
                self.running.append(entry)
                self.seen.append(list(self.running))
            real_time.sleep(self.seconds)
            with self.lock:
                self.running.remove(entry)
            return self.inner(None, None, None, "cpu", 1.0)
        return run


def test_fresh_evaluations_ask_for_the_kernel_evidence_only_for_the_device_clock(tmp_path, monkeypatch):
    """Its ncu run changes no time and cost ~8 s per win on an H200: off with --no-device-clock
    unless --kernel-evidence; on by default, since the device clock (per_call) comes from it."""
    mod = load_script()
    for flag, expected in (([], True), (["--no-device-clock"], False),
                           (["--no-device-clock", "--kernel-evidence"], True)):
        run_eval, _ = _fake_eval([0.01])
        monkeypatch.setattr(mod, "run_eval", run_eval)
        out = tmp_path / f"rows{'-'.join(flag)}.jsonl"
        assert mod.main(["--reps", "1", "--fresh", "1", "--cache", "off", "--pair", PAIR, "--device", "cpu",
                         "--out", str(out)] + flag) == 0
        assert run_eval.evidences == [expected]


def test_plan_is_round_robin_over_pairs(tmp_path, monkeypatch):
    mod = load_script()
    run_eval, _ = _fake_eval([0.01])
    monkeypatch.setattr(mod, "run_eval", run_eval)
    out = tmp_path / "rows.jsonl"
    assert mod.main(["--reps", "2", "--fresh", "2", "--pair", PAIR, "--pair", PAIR + "@batch_size=8",
                     "--device", "cpu", "--out", str(out), "--fresh-jobs", "1"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    order = [(r["label"], r["cache"], r["rep"]) for r in rows]
    a, b = "relu_problem", "relu_problem@batch_size=8"
    assert order == [(a, "on", 0), (b, "on", 0),
                     (a, "on", 1), (a, "off", 1), (b, "on", 1), (b, "off", 1),
                     (a, "on", 2), (a, "off", 2), (b, "on", 2), (b, "off", 2)]


@pytest.mark.parametrize("jobs", [1, 4])
def test_warm_repetitions_run_in_waves_of_jobs_and_never_beside_their_primes(tmp_path, monkeypatch, jobs):
    """--jobs: warm evaluations in flight at once in the one server, primes apart from repetitions
    (a repetition with the cache on must find its prime's baselines)."""
    mod = load_script()
    flight = InFlight(0.15)
    seen = flight.seen
    # run_eval_warm(evaluator, problem, candidate, cache, evidence): one key per problem and cache
    monkeypatch.setattr(mod, "run_eval_warm", flight.stand_in(lambda args: (args[1].name, args[3])))
    out = tmp_path / "rows.jsonl"
    assert mod.main(["--reps", "3", "--fresh", "0", "--pair", PAIR, "--pair", PAIR + "@batch_size=8",
                     "--device", "cpu", "--out", str(out), "--jobs", str(jobs)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 + 2 * 2 * 3 and {r["process"] for r in rows} == {"warm"}
    assert max(len(s) for s in seen) == jobs
    primes = [i for i, r in enumerate(rows) if r["prime"]]
    assert primes == [0, 1]  # both primes written before any repetition started
    # --prime-jobs caps the cold wave (primes compile their baselines) below --jobs
    flight.seen.clear()
    out2 = tmp_path / "rows2.jsonl"
    pairs = [a for size in (8, 16, 32) for a in ("--pair", f"{PAIR}@batch_size={size}")]
    assert mod.main(["--reps", "1", "--fresh", "0", "--cache", "on", "--pair", PAIR, *pairs, "--device", "cpu",
                     "--out", str(out2), "--jobs", str(jobs), "--prime-jobs", "2"]) == 0
    rows2 = [json.loads(line) for line in out2.read_text().splitlines()]
    assert [r["prime"] for r in rows2] == [True] * 4 + [False] * 4
    assert max(len(s) for s in flight.seen[:4]) == min(jobs, 2)  # two prime waves of two
    assert max(len(s) for s in flight.seen[4:]) == jobs  # the repetitions: --jobs at once
    assert mod.main(["--prime-jobs", "0", "--pair", PAIR, "--out", str(tmp_path / "x.jsonl")]) == 2
    counted = sorted((r["label"], r["cache"], r["rep"]) for r in rows if not r["prime"])
    assert len(set(counted)) == 12


def test_time_cap_is_predictive_and_bounds_the_timeout(tmp_path, monkeypatch):
    import time as real_time
    from types import SimpleNamespace

    mod = load_script()
    now = [0.0]
    inner, timeouts = _fake_eval([20.0])  # each evaluation "takes" 20 s; the cap is 30 s

    def run_eval(*args):
        result = inner(*args)
        now[0] += result[3]  # the fake clock moves by the evaluation's wall time
        return result

    monkeypatch.setattr(mod, "run_eval", run_eval)
    monkeypatch.setattr(mod, "time", SimpleNamespace(perf_counter=lambda: now[0], strftime=real_time.strftime))
    out = tmp_path / "rows.jsonl"
    assert mod.main(["--reps", "3", "--fresh", "3", "--pair", PAIR, "--device", "cpu", "--out", str(out),
                     "--max-minutes", "0.5", "--fresh-jobs", "1",
                     "--summary", str(tmp_path / "s.md")]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 1  # the next one would not fit: 20 s expected with < 20 s left
    assert timeouts[0] <= 30.0  # the first one's timeout is cut to the time left
    assert "stopped after --max-minutes 0.5" in (tmp_path / "s.md").read_text()


def test_nvml_absent_here_and_clock_index():
    mod = load_script()
    assert mod.gpu_index("cuda:3") == "3" and mod.gpu_index("cpu") is None
    assert mod.gpu_index("auto") in ("0",) or mod.gpu_index("auto").isdigit()
    # This machine has no NVIDIA driver: NVML does not load, and no clock is read or faked.
    assert mod.nvml() is None
    assert mod.read_clocks("0") is None


@pytest.mark.parametrize("fresh_jobs", [1, 3])
def test_fresh_processes_start_fresh_jobs_at_a_time_after_the_warm_ones(tmp_path, monkeypatch, fresh_jobs):
    """--fresh-jobs: that many `kernelagent eval` processes at once (their servers take the GPU one
    at a time through the device lock), never beside a warm wave."""
    mod = load_script()
    flight = InFlight(0.1)
    seen = flight.seen
    monkeypatch.setattr(mod, "run_eval", flight.stand_in(lambda args: "fresh"))
    monkeypatch.setattr(mod, "run_eval_warm", flight.stand_in(lambda args: "warm"))
    out = tmp_path / "rows.jsonl"
    pairs = ["--pair", PAIR, "--pair", PAIR + "@batch_size=8", "--pair", PAIR + "@batch_size=16"]
    assert mod.main(["--reps", "3", "--fresh", "2", "--cache", "on", *pairs, "--device", "cpu", "--out", str(out),
                     "--fresh-jobs", str(fresh_jobs)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sum(r["process"] == "fresh" for r in rows) == 6
    assert max(s.count("fresh") for s in seen) == fresh_jobs
    assert not any("fresh" in s and "warm" in s for s in seen)
    assert mod.main(["--fresh-jobs", "0", "--pair", PAIR, "--out", str(tmp_path / "x.jsonl")]) == 2


@pytest.mark.parametrize("process", ["fresh", "warm"])
def test_evaluations_run_as_a_pipeline_not_in_waves(tmp_path, monkeypatch, process):
    """A new evaluation starts as soon as one ends: one slow evaluation (a KernelBench problem of
    several ms) no longer holds back the starts behind it, as waves that waited for their slowest
    did (issue 42: the whole table in one 8-minute run). Fresh processes --fresh-jobs at a time,
    warm ones --jobs at a time."""
    import threading
    import time as real_time

    mod = load_script()
    inner, _ = _fake_eval([0.01])
    lock, order = threading.Lock(), []

    def timed(problem):
        slow = "batch_size" not in problem.name  # the first pair is the slow one
        with lock:
            order.append(("start", problem.name, slow))
        real_time.sleep(0.6 if slow else 0.05)
        with lock:
            order.append(("end", problem.name, slow))

    def run_eval(problem, candidate, cache_dir, device, timeout, evidence=None):
        timed(problem)
        return inner(problem, candidate, cache_dir, device, timeout, evidence)

    def run_eval_warm(evaluator, problem, candidate, cache, evidence=None):
        timed(problem)
        return inner(problem, candidate, None, "cpu", 1.0, evidence)

    monkeypatch.setattr(mod, "run_eval", run_eval)
    monkeypatch.setattr(mod, "run_eval_warm", run_eval_warm)
    out = tmp_path / "rows.jsonl"
    pairs = [a for size in ("", "@batch_size=8", "@batch_size=16", "@batch_size=32") for a in ("--pair", PAIR + size)]
    assert mod.main(["--reps", "1", "--fresh", "1" if process == "fresh" else "0", "--cache", "on", "--no-prime",
                     *pairs, "--device", "cpu", "--out", str(out), "--fresh-jobs", "2", "--jobs", "2"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and {r["process"] for r in rows} == {process}
    slow_end = next(i for i, e in enumerate(order) if e[0] == "end" and e[2])
    # While the slow one ran, the other worker went through all three fast ones.
    assert sum(1 for e in order[:slow_end] if e[0] == "end" and not e[2]) == 3, order


# -- issue 58: the device clock beside the wall one, and misses that carry their cause ------------

def gpu_data(speedup: float, *, device_speedup: float | None = None, wall_ms: float = 0.2,
             device_ms: float | None = None, facts: bool = True) -> dict:
    """A correct GPU result's JSON as the harness returns it (result.to_dict), with the device
    clock (per_call, speedups_device) where `device_ms` is given, and the run's facts where `facts`."""
    data = {"status": "correct", "device": "cuda",
            "timings": {"candidate": {"median_ms": wall_ms, "samples_ms": [wall_ms] * 8, "meaningful": True,
                                      "clocks_mhz": [1980.0, 1755.0] if facts else []},
                        "compile": {"median_ms": speedup * wall_ms, "meaningful": True}},
            "speedups": {"compile": speedup, "eager": 2.0},
            "speedup_intervals": {"compile": [speedup - 0.01, speedup + 0.01]}, "baselines_cached": False,
            "concurrency": {"shared_device": True, "wait_s": 0.12, "idle_wait_s": 0.03, "copy_us": 55.0,
                            "bandwidth_wait_s": 0.2} if facts else {}}
    if device_ms is not None:
        data["per_call"] = {"device_ms": device_ms, "wall_ms": wall_ms, "host_share": (wall_ms - device_ms) / wall_ms,
                            "source": "trace"}
        data["speedups_device"] = {"compile": device_speedup}
    return data


def test_rows_carry_the_device_clock_and_not_recorded_where_absent():
    fid = load_script()
    pair = fid.Pair("p", Path("p.py"), Path("c.py"))
    row = fid.make_row(pair, "on", 1, False, 0, gpu_data(0.75, device_speedup=1.14, wall_ms=0.01, device_ms=0.0066),
                       "", 1.0, None, None, "r", "fresh", in_flight=3)
    assert row["speedup_compile"] == 0.75 and row["speedup_compile_device"] == 1.14
    assert row["candidate_device_ms"] == 0.0066 and row["host_share"] == pytest.approx(0.34)
    assert row["clocks_mhz"] == [1980.0, 1755.0] and row["in_flight"] == 3 and row["rerun_alone"] is False
    assert row["concurrency"]["copy_us"] == 55.0
    bare = fid.make_row(pair, "on", 1, False, 0, gpu_data(1.0, facts=False), "", 1.0, None, None, "r", "warm")
    assert bare["per_call"] is None and bare["speedup_compile_device"] is None and bare["host_share"] is None


def test_fresh_against_warm_on_the_device_clock_shows_the_host_share():
    """The H200's tiny relu: 0.75x fresh and 1.14x warm on the wall clock; on the device clock the
    same kernel reads the same, and the fresh process's extra host time shows as host share."""
    fid = load_script()
    pair = fid.Pair("relu", Path("p.py"), Path("c.py"))
    rows = [fid.make_row(pair, "on", rep, False, 0, gpu_data(s, device_speedup=d, wall_ms=w, device_ms=0.0060),
                         "", 1.0, None, None, "r", process)
            for rep, (process, s, d, w) in enumerate([("warm", 1.14, 1.10, 0.00664), ("warm", 1.14, 1.10, 0.00664),
                                                      ("fresh", 0.75, 1.10, 0.0100)], 1)]
    summary = {s["process"]: s for s in fid.summarize(rows, reps=3)}
    assert summary["fresh"]["fresh_over_warm"] == pytest.approx(0.75 / 1.14)
    assert summary["fresh"]["fresh_over_warm_device"] == pytest.approx(1.0)
    assert summary["fresh"]["host_share"] == pytest.approx(0.4) and summary["warm"]["host_share"] == pytest.approx(
        (0.00664 - 0.006) / 0.00664)
    header = {"device": "H200", "torch": "x", "torch_cuda": "12", "triton": "y", "python": "3", "driver": "d",
              "clocks": "nvml, before and after each repetition", "reps": 3, "note": "", "notes": []}
    text = fid.render(list(summary.values()), rows, header)
    cells = lambda prefix: [c.strip() for c in next(x for x in text.splitlines()  # noqa: E731
                                                    if x.startswith(prefix)).strip("|").split("|")]
    cell = dict(zip(cells("| problem |"), cells("| relu | on | fresh |")))
    assert cell["x Ind"] == "0.75" and cell["x dev"] == "1.1" and cell["host share"] == "40.00%"
    assert cell["fresh/warm dev"] == "1.000" and cell["fresh/warm"] == "0.658"
    # no trace in the rows: the column says so rather than showing nothing
    bare = [fid.make_row(pair, "on", rep, False, 0, gpu_data(1.0), "", 1.0, None, None, "r", "warm") for rep in (1, 2)]
    text = fid.render(fid.summarize(bare, reps=2), bare, header)
    assert dict(zip(cells("| problem |"), cells("| relu | on | warm |")))["x dev"] == "not recorded"


def test_a_miss_carries_its_cause_and_a_hit_none():
    fid = load_script()
    pair = fid.Pair("p", Path("p.py"), Path("c.py"))
    speedups = [1.00, 1.05, 0.97, 1.04]  # CV 3.6%: a miss at 0.2 ms
    rows = [fid.make_row(pair, "on", rep, False, 0, gpu_data(s, device_speedup=s, device_ms=0.19), "", 1.0, None,
                         None, "r", "warm", in_flight=4) for rep, s in enumerate(speedups, 1)]
    rerun = fid.make_row(pair, "on", 0, False, 0, gpu_data(1.01, device_speedup=1.0, device_ms=0.19), "", 1.0,
                         None, None, "r", "warm", in_flight=1)
    entry = fid.summarize(rows + [rerun], reps=4)[0]
    assert entry["verdict"] == "MISS" and entry["n_ok"] == 4  # the re-run alone is not a repetition
    cause = entry["cause"]
    assert cause["repetition"] == 3  # 0.97, the farthest from the mean 1.015
    assert cause["neighbours"] == {"in_flight": 4, "shared_device": True, "retried_alone": False,
                                   "slot_wait_s": 0.12, "idle_wait_s": 0.03}
    assert cause["sm_clocks"]["first_mhz"] == 1980.0 and cause["sm_clocks"]["last_mhz"] == 1755.0
    assert cause["host_share"]["host_share"] == pytest.approx(0.05)
    assert cause["bandwidth"] == {"copy_us": 55.0, "wait_s": 0.2, "busy": False}
    alone = cause["rerun_alone"]
    assert alone["speedup_compile"] == 1.01 and alone["mean_of_repetitions"] == pytest.approx(1.015)
    assert alone["in_flight"] == 1 and alone["speedup_compile_device"] == 1.0
    header = {"device": "H200", "torch": "x", "torch_cuda": "12", "triton": "y", "python": "3", "driver": "d",
              "clocks": "nvml, before and after each repetition", "reps": 4, "note": "", "notes": []}
    text = fid.render([entry], rows, header)
    line = next(x for x in text.splitlines() if x.startswith("| p | on | warm | 3.64% |"))
    assert "rep 3 (of 1: 1, 2: 1.05, 3: 0.97, 4: 1.04)" in line and "4 in flight, shared the device" in line
    assert "re-run alone: 1.01x (device 1x, host share 5.00%) against a mean of 1.015x" in line
    # facts absent: each said to be not recorded; no re-run: said so
    bare = [fid.make_row(pair, "on", rep, False, 0, gpu_data(s, facts=False), "", 1.0, None, None, "r", "warm")
            for rep, s in enumerate(speedups, 1)]
    cause = fid.summarize(bare, reps=4)[0]["cause"]
    assert cause["neighbours"] == "not recorded"
    assert cause["sm_clocks"] == cause["host_share"] == cause["bandwidth"] == "not recorded"
    assert cause["rerun_alone"].startswith("not run")
    steady = [fid.make_row(pair, "on", rep, False, 0, gpu_data(1.0), "", 1.0, None, None, "r", "warm") for rep in (1, 2)]
    assert fid.summarize(steady, reps=2)[0]["cause"] is None


def test_a_missing_setting_is_re_run_alone_once_and_a_steady_one_is_not(tmp_path, monkeypatch):
    import threading
    import time as real_time

    mod = load_script()
    lock, counts, running, seen = threading.Lock(), {}, [0], []

    def run_eval_warm(evaluator, problem, candidate, cache, evidence=None):
        with lock:
            n = counts[problem.name] = counts.get(problem.name, 0) + 1
            running[0] += 1
            seen.append((problem.name, running[0], evidence))
        real_time.sleep(0.05)
        with lock:
            running[0] -= 1
        steady = "batch_size" in problem.name
        speedup = 1.0 if steady else [1.0, 1.06, 0.95, 1.0][(n - 1) % 4]
        return 0, gpu_data(speedup, device_speedup=1.0, device_ms=0.19), "", 0.05

    monkeypatch.setattr(mod, "run_eval_warm", run_eval_warm)
    out = tmp_path / "rows.jsonl"
    assert mod.main(["--reps", "3", "--fresh", "0", "--cache", "off", "--pair", PAIR, "--pair", PAIR + "@batch_size=8",
                     "--device", "cpu", "--out", str(out), "--jobs", "2", "--summary", str(tmp_path / "s.md")]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    reruns = [r for r in rows if r.get("rerun_alone")]
    assert [(r["label"], r["rep"], r["in_flight"]) for r in reruns] == [("relu_problem", 0, 1)]
    assert seen[-1][:2] == ("relu_problem.py", 1) and max(s[1] for s in seen) == 2  # alone; the others were not
    assert all(s[2] == "trace" for s in seen)  # the trace's evidence alone, for the device clock
    causes = [r for r in rows if r.get("kind") == "cause"]
    assert [(c["label"], c["cache"], c["process"]) for c in causes] == [("relu_problem", "off", "warm")]
    assert causes[0]["cause"]["rerun_alone"]["speedup_compile"] == 1.0
    summary = (tmp_path / "s.md").read_text()
    assert "## Misses and what they met" in summary and "re-run alone: 1x" in summary
    # resuming finds the re-run and the cause: nothing new is run, the table is the same
    assert mod.main(["--reps", "3", "--fresh", "0", "--cache", "off", "--pair", PAIR, "--pair", PAIR + "@batch_size=8",
                     "--device", "cpu", "--out", str(out), "--jobs", "2", "--resume"]) == 0
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert sum(1 for r in again if r.get("rerun_alone")) == 1


def test_repeatability_is_judged_on_the_device_clock_too_beside_the_wall_clock():
    """The H200's 0.135 ms relu (2026-11-29): its wall-clock speedup moved 1.6% over four
    repetitions (host share 4% in one) while the device clock held within 0.1%. The table judges
    both against the same target, says each, and counts each; a row without a device figure in
    every repetition is not judged on that clock."""
    fid = load_script()
    pair = fid.Pair("relu", Path("p.py"), Path("c.py"))
    reps = [(0.9501, 0.9577), (0.9208, 0.9565), (0.9518, 0.9579), (0.9521, 0.9563)]
    rows = [fid.make_row(pair, "on", rep, False, 0, gpu_data(s, device_speedup=d, wall_ms=0.135, device_ms=0.133),
                         "", 1.0, None, None, "r", "warm") for rep, (s, d) in enumerate(reps, 1)]
    steady = [fid.make_row(pair, "on", rep, False, 0, gpu_data(1.0, device_speedup=1.0 + rep * 0.03,
                                                                wall_ms=0.135, device_ms=0.133),
                           "", 1.0, None, None, "r", "fresh") for rep in (1, 2)]
    summary = {s["process"]: s for s in fid.summarize(rows + steady, reps=4)}
    warm, fresh = summary["warm"], summary["fresh"]
    assert warm["verdict"] == "MISS" and warm["cv_speedup_compile"] == pytest.approx(0.0162, abs=2e-4)
    assert warm["verdict_device"] == "ok" and warm["cv_speedup_device"] == pytest.approx(0.0009, abs=1e-4)
    assert fresh["verdict"] == "ok" and fresh["verdict_device"] == "MISS"  # the clocks are judged apart
    header = {"device": "H200", "torch": "x", "torch_cuda": "12", "triton": "y", "python": "3", "driver": "d",
              "clocks": "nvml, before and after each repetition", "reps": 4, "note": "", "notes": []}
    text = fid.render([warm, fresh], rows + steady, header)
    cells = lambda prefix: [c.strip() for c in next(x for x in text.splitlines()  # noqa: E731
                                                    if x.startswith(prefix)).strip("|").split("|")]
    cell = dict(zip(cells("| problem |"), cells("| relu | on | warm |")))
    assert cell["target"] == "<= 1%: MISS" and cell["CV x dev"] == "0.09%" and cell["target dev"] == "ok"
    assert "Target met for 1 of 2 problem/cache/process settings." in text
    assert "On the device clock (the same target, CV of the speedup on the kernel trace's time per call): " \
           "met for 1 of 2 settings." in text
    bare = [fid.make_row(pair, "on", rep, False, 0, gpu_data(1.0), "", 1.0, None, None, "r", "warm") for rep in (1, 2)]
    only_wall = fid.summarize(bare, reps=2)[0]
    assert only_wall["verdict"] == "ok" and only_wall["verdict_device"] == "n/a"
    assert "met for 0 of 0 settings; 1 without a device figure in every repetition." in fid.render(
        [only_wall], bare, header)


def test_a_correct_repetition_that_did_not_count_says_which_flag_held_it():
    """H200 fidelity run: a warm repetition of an honest softmax was correct but not passed (its
    median read 0.0 ms, held by the roofline), and its line read `rep 5: correct: `, nothing more.
    The row keeps the result's flags and the loop's calibration, and the line names what held it."""
    fid = load_script()
    pair = fid.Pair("softmax", Path("p.py"), Path("c.py"))
    data = gpu_data(2.5)
    data["passed"] = False
    data["timed_loop"] = {"server_ms_per_call": 0.0106, "claimed_mean_ms": 0.0069, "calls": 1008, "segments": 16,
                          "calibration_s": 0.65, "server_loop_s": 0.66, "calibration_reused": True, "source": "server"}
    data["flags"] = [{"kind": "clock-median", "severity": "info", "message": "the server's times are reported"},
                     {"kind": "impossible-speed", "severity": "review", "message": "median 0.0000 ms is below the "
                                                                                    "roofline floor"}]
    data["speedups"] = {}
    data["timings"]["candidate"]["median_ms"] = 0.0
    row = fid.make_row(pair, "on", 5, False, 1, data, "", 1.0, None, None, "r", "warm")
    assert row["passed"] is False and [f["kind"] for f in row["flags"]] == ["clock-median", "impossible-speed"]
    assert row["timed_loop"]["calibration_s"] == 0.65 and row["timed_loop"]["segments"] == 16
    good = [fid.make_row(pair, "on", rep, False, 0, gpu_data(2.5), "", 1.0, None, None, "r", "warm") for rep in (1, 2)]
    summary = fid.summarize(good + [row], reps=3)
    line = summary[0]["failures"][0]
    assert line.startswith("rep 5: correct; impossible-speed (review): median 0.0000 ms")
    assert "clock-median" not in line  # an info note held nothing
