"""The Ray backend on a local Ray (skipped where ray is not installed: `pip install ray`)."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install ray); the Ray backend is optional")

from kernelagent.rl import KernelReward  # noqa: E402
from tests.conftest import read  # noqa: E402
from tests.rl_fixtures.common import GOOD, RELU_PROBLEM, WRONG, fast_config  # noqa: E402

# Under pytest-xdist the files that start a local Ray run in one worker and alone: beside a second
# worker on 2 cores a Ray actor died mid-bench (ActorDiedError); never one after another.
pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.alone]


def test_ray_backend_scores_a_batch_in_order(tmp_path):
    from kernelagent.rl.ray_backend import RayBackend

    backend = RayBackend(cpu_actors=2, cache_dir=str(tmp_path),
                         init_kwargs={"num_cpus": 2, "include_dashboard": False,
                                      "log_to_driver": False})
    try:
        reward = KernelReward(backend, eval_config=fast_config())
        completions = [f"```python\n{c}```" for c in (WRONG, GOOD, WRONG + "\n# other")] + ["no code"]
        values = reward(prompts=["p"] * 4, completions=completions, completion_ids=[[0]] * 4,
                        trainer_state=None, problem_source=[read(RELU_PROBLEM)] * 4)
        assert values == [0.5, 1.5, 0.5, 0.0]
        assert backend.size == 2 and not backend.fingerprint().get("cuda")
    finally:
        backend.close()
        ray.shutdown()
