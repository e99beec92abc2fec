"""The device scripts (scripts/device/) are run on the GPU machine, where a crash costs a device
call: here they are parsed, and the probes that can run on the CPU run on tiny buffers (times
not meaningful), so that a script broken on the CPU never reaches the device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts" / "device"


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.sh")))
def test_shell_scripts_parse(script):
    done = subprocess.run(["bash", "-n", str(SCRIPTS / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.py")))
def test_python_scripts_compile_and_answer_help(script):
    done = subprocess.run([sys.executable, str(SCRIPTS / script), "--help"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0 and "usage" in done.stdout.lower(), done.stdout[-1000:] + done.stderr[-2000:]


def _probe(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OUT=str(tmp_path))
    return subprocess.run([sys.executable, str(SCRIPTS / "placement_probe.py"), "--rows", "16", "--cols", "256", *args],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)


@pytest.mark.parametrize("flags", [[], ["--no-flush", "--no-kept", "--reuse-input"]])
def test_placement_probe_loop_runs_and_writes_a_row_per_call(tmp_path, flags):
    done = _probe(tmp_path, "--loop", "--calls", "5", *flags)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "placement_loop.jsonl").read_text().splitlines()]
    assert [r["call"] for r in rows] == list(range(5))
    assert all(r["flush"] == ("--no-flush" not in flags) and r["fresh_input"] == ("--reuse-input" not in flags)
               for r in rows)
    assert done.stdout.startswith("loop: 5 calls")


def test_placement_probe_pairs_every_ordered_pair(tmp_path):
    done = _probe(tmp_path, "--buffers", "3", "--reps", "2", "--rounds", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "placement.jsonl").read_text().splitlines()]
    assert sorted((r["in"], r["out"]) for r in rows if "in" in r) == [(i, j) for i in range(3) for j in range(3) if i != j]


def test_scrub_probe_runs_every_scenario_it_is_asked(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path))
    done = subprocess.run([sys.executable, str(SCRIPTS / "scrub_probe.py"), "--gb", "0.001", "--calls", "2",
                           "--rounds", "1", "--rows", "8", "--cols", "64", "--copy-mb", "0.5", "--reads", "2",
                           "--scenarios", "none,free-self,free-other,alloc-other"],
                          capture_output=True, text=True, timeout=180, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "scrub.jsonl").read_text().splitlines()]
    assert sorted((r["work"], r["scenario"]) for r in rows) == sorted(
        (w, s) for w in ("relu", "copy") for s in ("none", "free-self", "free-other", "alloc-other"))
    assert all(len(r["rows"]) == (2 if r["work"] == "relu" else 8) for r in rows)
    assert "no reading on this device" in done.stdout  # the bandwidth reading is a GPU's


def test_segment_probe_reports_every_call_of_every_segment(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path))
    done = subprocess.run([sys.executable, str(SCRIPTS / "segment_probe.py"), "--segments", "2", "--covers", "150",
                           "--gap-ms", "1"], capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "segment_probe.jsonl").read_text().splitlines()]
    assert [(r["cover_us"], r["segment"], r["stop"]) for r in rows] == [(150.0, 0, True), (150.0, 1, True)]
    assert all(len(r["readings"]) == 2 and all(e > 0 and h > 0 for e, h in r["readings"]) for r in rows)
    assert "call 0: event median" in done.stdout and "call 1: event median" in done.stdout


def test_the_concurrency_probe_reports_each_candidates_host_share_from_both_clocks():
    """A launch cover too short for a candidate's launch shows as host share first: the probe
    prints each candidate's wall against its kernel trace's device time (1 - device/wall)."""
    sys.path[:0] = [str(SCRIPTS), str(REPO / "benchmarks")]
    import concurrency_probe

    rows = [{"key": "level1/1_relu#0", "median_ms": 0.1344, "device_ms": 0.1330},
            {"key": "level1/1_relu#1", "median_ms": 0.1368, "device_ms": 0.1331},
            {"key": "level1/1_relu#2", "median_ms": 0.1340, "device_ms": 0.1330},
            {"key": "level1/2_gelu#0", "median_ms": 0.0680, "device_ms": 0.0666},
            {"key": "level1/5_softmax#0", "median_ms": 0.1320, "device_ms": None}]
    assert concurrency_probe.host_shares(rows) == \
        "host share by candidate (median of its copies): 1_relu 1.0%, 2_gelu 2.1%"
    assert concurrency_probe.host_shares(rows[-1:]) == "host share: no row has both clocks"


def test_eval_line_summarises_a_result_and_says_when_there_is_none(tmp_path):
    """scripts/device/eval_line.py, the one summary of warm_eval_run.sh and cold_eval_ab.sh."""
    result = {"status": "correct", "speedups": {"compile": 1.17},
              "stage_seconds": {"server_start": 3.47, "evidence": 0.1},
              "concurrency": {"baselines_job": {"stage_seconds": {"baselines_compile": 6.09}}},
              "fingerprint": {"start_s": {"imports": 1.56}, "concurrency": {"compile_workers": 1}},
              "isolation": {"daemon": {"pid": 7, "started_now": True, "socket": "/x"}}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result) + "\n")
    run = lambda p: subprocess.run([sys.executable, str(SCRIPTS / "eval_line.py"), str(p), "cold", "0", "10", "23.3"],  # noqa: E731
                                   capture_output=True, text=True, timeout=60, cwd=REPO)
    line = run(path).stdout
    assert line.startswith("cold: rc 0, 13.3 s wall; correct") and "audited False" in line
    assert "'baselines_compile': 6.09" in line and "{'imports': 1.56}" in line and "'started_now': True" in line
    assert "no result" in run(tmp_path / "missing.json").stdout
    # --keep: each run, with or without a result, one line of the call's one file
    (tmp_path / "r.err").write_text("x" * 2500 + "the end")
    kept = tmp_path / "runs.jsonl"
    for p in (path, tmp_path / "missing.json"):
        subprocess.run([sys.executable, str(SCRIPTS / "eval_line.py"), str(p), "cold", "0", "10", "23.5",
                        "--keep", str(kept), "--stderr", str(tmp_path / "r.err")], check=True, timeout=60, cwd=REPO)
    lines = [json.loads(x) for x in kept.read_text().splitlines()]
    assert [(x["tag"], x["rc"], x["wall_s"], x["result"]) for x in lines] == [("cold", 0, 13.5, result),
                                                                               ("cold", 0, 13.5, None)]
    assert all(len(x["stderr_tail"]) == 2000 and x["stderr_tail"].endswith("the end") for x in lines)


def test_steady_latency_reads_each_devices_steady_state(tmp_path):
    """scripts/device/steady_latency.py: the evaluations that started after a device's first
    result, their mean latency and stages; a device with none says so."""
    span = lambda dev, a, b, c: [dev, "p", a, b, 0.0, 0.0, {"start": 1.0, "compile": c}, False]  # noqa: E731
    data = {"rows": [{"gpus": "0,1", "timeline": {"spans": [
        span("A", 0.0, 10.0, 2.0), span("A", 10.0, 16.0, 4.0), span("A", 11.0, 21.0, 6.0),
        span("B", 0.0, 9.0, 1.0)]}}]}
    path = tmp_path / "scale.json"
    path.write_text(json.dumps(data))
    out = subprocess.run([sys.executable, str(SCRIPTS / "steady_latency.py"), str(path)], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out[0].endswith("A: 3 evaluations, 2 steady, latency 8.00 s, stages {'start': 1.0, 'compile': 5.0, "
                           "'correctness': 0.0, 'timing': 0.0, 'post-check': 0.0, 'evidence': 0.0}"), out
    assert out[1].endswith("B: 1 evaluations, none after the first result"), out


def test_ab_summary_groups_the_runs_by_problem_and_variant(tmp_path):
    """scripts/device/ab_summary.py (connections_ab.sh): medians over the rounds per problem and
    variant; an incorrect run counts in the tally, not in the times; a run with no result too."""
    def run(tag, status, ms, speedup, start):
        return {"tag": tag, "result": {"status": status, "timings": {"candidate": {"median_ms": ms}},
                                       "speedups": {"compile": speedup}, "stage_seconds": {"start": start}}}
    lines = [run("r1|5_softmax|default", "correct", 0.13, 1.2, 0.4),
             run("r2|5_softmax|default", "correct", 0.15, 1.0, 0.6),
             run("r3|5_softmax|default", "incorrect", 9.0, 9.0, 0.5),
             run("r1|5_softmax|X=1", "correct", 0.14, 1.1, 0.3),
             {"tag": "r2|5_softmax|X=1", "result": None}]
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = subprocess.run([sys.executable, str(SCRIPTS / "ab_summary.py"), str(path)], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out == ["5_softmax X=1: 1/2 correct, candidate 0.14 ms, x1.1 over Inductor, start 0.3 s",
                   "5_softmax default: 2/3 correct, candidate 0.14 ms, x1.1 over Inductor, start 0.5 s"], out
