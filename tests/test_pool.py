"""The evaluator pool: parallel jobs, order kept, device parsing."""

from __future__ import annotations

import pytest

from kernelagent.harness import Status
from kernelagent.harness.caller.pool import EvaluatorPool, parse_gpus, visible_gpus
from tests.conftest import CANDIDATES, read


def test_parse_gpus():
    assert parse_gpus("0,1") == ["cuda:0", "cuda:1"]
    assert parse_gpus("cpu") == ["cpu"]
    assert parse_gpus(None) is None and parse_gpus("all") is None
    with pytest.raises(ValueError):
        parse_gpus("a,b")


def test_visible_gpus_honours_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_gpus() == [2, 3]


def test_map_runs_on_two_workers_and_keeps_order(cache_dir, fast_config):
    problem = CANDIDATES / "relu_problem.py"
    names = ["relu_wrong.py", "relu_good.py", "syntax_error.py", "relu_good.py"]
    with EvaluatorPool(devices=["cpu", "cpu"], cache_dir=cache_dir) as pool:
        assert pool.size == 2
        results = pool.map([(problem, read(CANDIDATES / n), fast_config) for n in names])
    assert [r.status for r in results] == [Status.INCORRECT, Status.CORRECT, Status.COMPILE_ERROR, Status.CORRECT]


@pytest.mark.parametrize("isolation", ["none", "auto"])
def test_server_started_from_a_short_lived_thread_outlives_it(cache_dir, fast_config, isolation):
    import threading

    from kernelagent.harness import Evaluator

    evaluator = Evaluator(device="cpu", cache_dir=cache_dir, isolation=isolation)
    starter = threading.Thread(target=evaluator.start)
    starter.start()
    starter.join()  # the thread that started the server is gone now
    try:
        result = evaluator.evaluate(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"), fast_config)
        assert result.status == Status.CORRECT, result.reason
    finally:
        evaluator.close()


# -- host contention (issue 17): CPU shares, baselines once per problem, shared compile cache --
def test_split_cpus_gives_disjoint_near_equal_shares():
    from kernelagent.harness.caller.pool import split_cpus

    assert split_cpus(2, range(16)) == [list(range(8)), list(range(8, 16))]
    shares = split_cpus(3, [0, 1, 2, 3, 4, 5, 6])
    assert shares == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_cpus(1, range(16)) == [None]  # one evaluator keeps the whole machine
    assert split_cpus(4, [0, 1]) == [None] * 4  # fewer CPUs than evaluators: no pinning


def test_baseline_claim_makes_the_second_evaluator_wait(tmp_path):
    import threading
    import time

    from kernelagent.harness.caller.baseline_cache import BaselineCache

    cache = BaselineCache(tmp_path)
    order: list[str] = []
    holding = threading.Event()

    def first():
        with cache.claim("k", wait_s=5) as held:
            assert held
            holding.set()
            time.sleep(0.5)
            cache.put("k", {"timings": {"eager": {"median_ms": 1.0}}})
            order.append("first wrote")

    thread = threading.Thread(target=first)
    thread.start()
    holding.wait(5)
    started = time.monotonic()
    with cache.claim("k", wait_s=5) as held:  # another thread of this process: flock excludes it too
        order.append("second got it")
        assert held and cache.get("k") is not None
    assert time.monotonic() - started >= 0.3
    thread.join()
    assert order == ["first wrote", "second got it"]
    with cache.claim("other", wait_s=0) as held:  # a free key is taken at once
        assert held


def test_baseline_claim_gives_up_after_its_wait_and_dies_with_its_holder(tmp_path):
    import subprocess
    import sys
    import time

    from kernelagent.harness.caller.baseline_cache import BaselineCache

    cache = BaselineCache(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(cache.dir / 'k.lock')!r}, os.O_RDWR | os.O_CREAT)\n" if cache.dir.mkdir(
            parents=True) is None else "") + "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with cache.claim("k", wait_s=0.3) as held:  # another process holds it past our wait
            assert held is False
        assert 0.25 <= time.monotonic() - started < 5
        holder.kill()  # a killed holder never blocks the others
        holder.wait()
        with cache.claim("k", wait_s=5) as held:
            assert held is True
    finally:
        holder.kill()


def test_interleaved_queues_round_robin_over_problems():
    from types import SimpleNamespace

    from kernelagent.bench.runner import interleaved

    a, b, c = (SimpleNamespace(key=k) for k in "abc")
    jobs = [(a, None, "s0", ""), (a, None, "s1", ""), (a, None, "s2", ""), (b, None, "s0", ""), (c, None, "s0", ""),
            (c, None, "s1", "")]
    assert [(j[0].key, j[2]) for j in interleaved(jobs)] == [
        ("a", "s0"), ("b", "s0"), ("c", "s0"), ("a", "s1"), ("c", "s1"), ("a", "s2")]


def _good_variant(i: int) -> str:
    return f"# variant {i}\n" + read(CANDIDATES / "relu_good.py")


@pytest.mark.parametrize("host_tuning", [True, False])
def test_two_evaluators_time_a_problems_baselines_once(tmp_path, fast_config, host_tuning):
    """Two distinct correct candidates of one problem, at once, on two evaluators sharing a
    cache: with host tuning one times the baselines and the other reuses them; without it,
    both time them (what two GPUs did before issue 17)."""
    from kernelagent.harness import EvalConfig

    problem = CANDIDATES / "relu_problem.py"
    config = EvalConfig.from_dict({**fast_config.to_dict(), "baselines": True})
    with EvaluatorPool(devices=["cpu", "cpu"], cache_dir=tmp_path, host_tuning=host_tuning) as pool:
        for evaluator in pool.evaluators:  # both servers up first: the two jobs then start together
            evaluator.start()
        results = pool.map([(problem, _good_variant(i), config) for i in range(2)])
    assert [r.status for r in results] == [Status.CORRECT] * 2, [r.reason for r in results]
    assert all("eager" in r.timings for r in results)
    cached = sorted(r.baselines_cached for r in results)
    timed_here = [r for r in results if "baselines" in r.stage_seconds]
    if host_tuning:
        assert cached == [False, True] and len(timed_here) == 1
        waiter = next(r for r in results if r.baselines_cached)
        assert "baseline_wait" in waiter.stage_seconds
    else:
        assert cached == [False, False] and len(timed_here) == 2


CPU_PINNED = '''
import os
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        # The harness pinned this job's server to CPU {cpu} and sized torch's pool to match.
        if os.sched_getaffinity(0) != {{{cpu}}} or torch.get_num_threads() != 1:
            raise RuntimeError(f"affinity {{os.sched_getaffinity(0)}}, threads {{torch.get_num_threads()}}")
        return torch.relu(x)
'''


def test_a_pinned_server_runs_its_jobs_on_its_cpus(tmp_path, fast_config):
    import os

    from kernelagent.harness import EvalConfig, Evaluator

    cpu = max(os.sched_getaffinity(0))
    config = EvalConfig.from_dict({**fast_config.to_dict(), "timing": False, "defences": False})
    with Evaluator(device="cpu", cache_dir=tmp_path, cpus=[cpu]) as evaluator:
        result = evaluator.evaluate(CANDIDATES / "relu_problem.py", CPU_PINNED.format(cpu=cpu), config)
    assert result.status == Status.CORRECT, result.reason


LOOKS_FOR_SHARED_CACHE = '''
import os
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        # A candidate that could read (or plant) the reference side's compile cache could
        # poison later baselines: it must not even see it.
        if os.path.exists({shared!r}):
            raise RuntimeError("the shared cache is visible")
        if os.path.isdir({root!r}) and os.listdir({root!r}):  # hidden: an empty mount, at most
            raise RuntimeError("the cache root shows " + ", ".join(os.listdir({root!r})))
        return torch.relu(x)
'''


def test_reference_compile_cache_is_shared_and_hidden_from_candidates(tmp_path, fast_config):
    """The torch.compile baseline compiles into the cache root's reference-compile/ (kept for
    the next evaluation of the problem on any evaluator of this machine), which the candidate's
    jail hides. On this CPU the second evaluation's baselines took 9 s against 20 s."""
    from kernelagent.harness import EvalConfig, Evaluator

    shared = tmp_path / "reference-compile"
    config = EvalConfig.from_dict({**fast_config.to_dict(), "compile_baseline_on_cpu": True,
                                   "use_baseline_cache": False, "defences": False})
    source = LOOKS_FOR_SHARED_CACHE.format(shared=str(shared), root=str(tmp_path))
    with Evaluator(device="cpu", cache_dir=tmp_path) as evaluator:
        result = evaluator.evaluate(CANDIDATES / "relu_problem.py", source, config)
    if (result.isolation.get("jail") or {}).get("mode") == "none":
        pytest.skip("no per-job namespaces here: nothing hides the cache root (isolation 'none' says so)")
    assert result.status == Status.CORRECT, result.reason
    assert "compile" in result.timings, result.flags
    assert any((shared / "inductor").rglob("*.py")), "Inductor's compiled baseline is not in the shared cache"


def test_without_host_tuning_baselines_compile_in_the_job(tmp_path, fast_config):
    from kernelagent.harness import Evaluator

    with Evaluator(device="cpu", cache_dir=tmp_path, share_compile_cache=False) as evaluator:
        result = evaluator.evaluate(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"), fast_config)
    assert result.status == Status.CORRECT, result.reason
    assert not (tmp_path / "reference-compile").exists()
