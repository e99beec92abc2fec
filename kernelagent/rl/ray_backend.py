"""A Ray backend: evaluations fanned out over a Ray cluster's GPUs, by Ray.

    from kernelagent.rl import KernelReward
    from kernelagent.rl.ray_backend import RayBackend
    reward = KernelReward(backend=RayBackend(address="auto"))   # one actor per cluster GPU

Each actor holds one harness `Evaluator` on the GPU Ray gave it (`num_gpus=1`, so Ray sets
its CUDA_VISIBLE_DEVICES and no two actors share a GPU); `ray.util.ActorPool` hands jobs to
whichever actor is free, results in order. Problems travel as source text (nodes do not
share a file system). Ray is imported only when a RayBackend is made.
"""

from __future__ import annotations

import threading
from typing import Any


class _EvalActor:
    """Lives in a Ray worker: one Evaluator, reused for every job sent to this actor."""

    def __init__(self, device: str, cache_dir: str | None, isolation: str) -> None:
        from kernelagent.harness import Evaluator

        self.evaluator = Evaluator(device=device, cache_dir=cache_dir, isolation=isolation)

    def evaluate(self, problem_source: str, problem_id: str, candidate: str,
                 config: dict | None) -> dict:
        from kernelagent.harness import EvalConfig
        from kernelagent.rl.problems import problem_from_source

        try:
            problem = problem_from_source(problem_source, problem_id)
            cfg = EvalConfig.from_dict(config) if config else None
            return self.evaluator.evaluate(problem, candidate, cfg).to_dict()
        except Exception as exc:  # the backend's failure, not the candidate's
            return {"status": "harness_error", "reason": f"{type(exc).__name__}: {exc}"}

    def fingerprint(self) -> dict:
        return self.evaluator.fingerprint()

    def close(self) -> None:
        self.evaluator.close()


class RayBackend:
    """`evaluate_batch(jobs)` over Ray actors. `actors`: how many (default: one per GPU in
    the cluster; `cpu_actors` when it has none). `address`: passed to `ray.init`."""

    def __init__(self, *, address: str | None = None, actors: int | None = None,
                 gpus_per_actor: float = 1.0, cpu_actors: int = 1,
                 cache_dir: str | None = None, isolation: str = "auto",
                 init_kwargs: dict[str, Any] | None = None) -> None:
        import ray
        from ray.util import ActorPool

        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, **(init_kwargs or {}))
        gpus = int(ray.cluster_resources().get("GPU", 0))
        use_gpu = gpus > 0 and gpus_per_actor > 0
        count = actors or (int(gpus / gpus_per_actor) if use_gpu else cpu_actors)
        options = {"num_gpus": gpus_per_actor, "num_cpus": 1} if use_gpu else {"num_cpus": 1}
        remote = ray.remote(**options)(_EvalActor)
        device = "cuda" if use_gpu else "cpu"
        self.actors = [remote.remote(device, cache_dir, isolation) for _ in range(max(1, count))]
        self.devices = [f"ray:{device}"] * len(self.actors)
        self._pool = ActorPool(self.actors)
        self._lock = threading.Lock()  # ActorPool is not thread-safe
        self._ray = ray

    @property
    def size(self) -> int:
        return len(self.actors)

    def evaluate_batch(self, jobs: list[tuple[Any, str, Any]]) -> list[Any]:
        from kernelagent.harness import EvalResult

        payloads = [(p.source, p.display, code, cfg.to_dict() if cfg is not None else None)
                    for p, code, cfg in jobs]
        out: list[Any] = []
        with self._lock:
            for payload in payloads:
                self._pool.submit(lambda actor, args: actor.evaluate.remote(*args), payload)
            for _ in payloads:
                try:
                    out.append(EvalResult.from_dict(self._pool.get_next()))
                except Exception as exc:  # an actor died: an infrastructure failure
                    out.append(exc)
        return out

    def evaluate(self, problem: Any, candidate: str, config: Any = None) -> Any:
        result = self.evaluate_batch([(problem, candidate, config)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def fingerprint(self) -> dict:
        return self._ray.get(self.actors[0].fingerprint.remote())

    def close(self) -> None:
        for actor in self.actors:
            try:
                self._ray.get(actor.close.remote(), timeout=60)
            except Exception:
                pass
            self._ray.kill(actor)
        self.actors = []

    def __enter__(self) -> "RayBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
