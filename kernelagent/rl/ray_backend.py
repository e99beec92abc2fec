"""A Ray backend: evaluations fanned out over a Ray cluster's GPUs, by Ray.

    from kernelagent.rl import KernelReward
    from kernelagent.rl.ray_backend import RayBackend
    reward = KernelReward(backend=RayBackend(address="auto"))   # one actor per cluster GPU

Each actor holds one harness `Evaluator` on the GPU Ray gave it (`num_gpus=1`, so Ray sets
its CUDA_VISIBLE_DEVICES and no two actors share a GPU); `ray.util.ActorPool` hands jobs to
whichever actor is free, results in order. Problems travel as source text (nodes do not
share a file system). Ray is imported only when a RayBackend is made.

The actors, `connect` and `plan_workers` live below, in kernelagent/cluster/actors.py, shared
with `kernelagent bench --ray`: one harness per GPU on every GPU node; on a cluster with no GPU
at all, `cpu_actors` per node. Only plain dicts (EvalResult.to_dict) and source text cross
between the driver and the actors; the candidate's process stays inside the actor's harness.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from kernelagent.cluster.actors import (MAX_JOBS_PER_ACTOR, EvalActor, WorkerSlot, connect, plan_workers,  # noqa: F401
                                        start_actor)

if TYPE_CHECKING:
    from kernelagent.problem import Problem
    from pathlib import Path
    from kernelagent.harness import EvalConfig, EvalResult


class RayBackend:
    """`evaluate_batch(jobs)` over Ray actors. `actors`: how many (default: one per GPU of
    every node; `cpu_actors` per node on a cluster with no GPU). `address`: passed to `ray.init`."""

    def __init__(self, *, address: str | None = None, actors: int | None = None,
                 gpus_per_actor: float = 1.0, cpu_actors: int = 1,
                 cache_dir: str | None = None, isolation: str = "auto",
                 init_kwargs: dict[str, Any] | None = None, jobs_per_device: int = 0) -> None:
        import ray
        from ray.util import ActorPool

        connect(address, **(init_kwargs or {}))
        if actors is None and gpus_per_actor == 1.0:  # the usual case: placed node by node
            slots = plan_workers(ray, cpu_actors=cpu_actors)
            self.actors = [start_actor(ray, slot, cache_dir, isolation, jobs_per_device) for slot in slots]
            self.devices = [f"ray:{slot.device}" for slot in slots]
        else:
            gpus = int(ray.cluster_resources().get("GPU", 0))
            use_gpu = gpus > 0 and gpus_per_actor > 0
            count = actors or (int(gpus / gpus_per_actor) if use_gpu else cpu_actors)
            options = {"num_gpus": gpus_per_actor, "num_cpus": 1} if use_gpu else {"num_cpus": 1}
            remote = ray.remote(**options, max_concurrency=MAX_JOBS_PER_ACTOR + 2)(EvalActor)
            device = "cuda" if use_gpu else "cpu"
            self.actors = [remote.remote(device, cache_dir, isolation, (0, 1), jobs_per_device)
                           for _ in range(max(1, count))]
            self.devices = [f"ray:{device}"] * len(self.actors)
        if not self.actors:
            raise RuntimeError("the Ray cluster has no node with a GPU or a CPU to run a harness on")
        # Each actor's server runs several jobs at once: the pool hands an actor as many
        # evaluations as its server admits (a handle listed once per job slot).
        jobs = [max(1, int((ray.get(a.fingerprint.remote()).get("concurrency") or {}).get("jobs") or 1))
                for a in self.actors]
        self.jobs = jobs
        self._pool = ActorPool([a for a, n in zip(self.actors, jobs) for _ in range(n)])
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

    def evaluate(self, problem: Problem | str | Path, candidate_source: str, config: EvalConfig | None = None, *,
                 cancel: threading.Event | None = None) -> EvalResult:
        """EvaluatorProtocol. `cancel` is not honoured: a job sent to a Ray actor runs to its
        verdict (the actor's own timeouts bound it)."""
        result = self.evaluate_batch([(problem, candidate_source, config)])[0]
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

    def __exit__(self, *exc: object) -> None:
        self.close()
