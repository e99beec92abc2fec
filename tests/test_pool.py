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
