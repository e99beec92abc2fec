"""A Ray backend: evaluations fanned out over a Ray cluster's GPUs, by Ray.

    from kernelagent.rl import KernelReward
    from kernelagent.rl.ray_backend import RayBackend
    reward = KernelReward(backend=RayBackend(address="auto"))   # one actor per cluster GPU

Each actor holds one harness `Evaluator` on the GPU Ray gave it (`num_gpus=1`, so Ray sets
its CUDA_VISIBLE_DEVICES and no two actors share a GPU); `ray.util.ActorPool` hands jobs to
whichever actor is free, results in order. Problems travel as source text (nodes do not
share a file system). Ray is imported only when a RayBackend is made.

`connect` and `plan_workers` are shared with `kernelagent bench --ray` (kernelagent/bench/
ray_pool.py): one harness per GPU on every GPU node; on a cluster with no GPU at all,
`cpu_actors` per node. Only plain dicts (EvalResult.to_dict) and source text cross between
the driver and the actors; the candidate's process stays inside the actor's harness.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkerSlot:
    """Where one harness actor goes: a node (Ray's id and its address) and its device."""

    node_id: str
    host: str
    device: str  # "cuda" (one GPU given by Ray) or "cpu"
    # This slot's share of its node's CPUs (pool.split_cpus): the index-th of per_node, so the
    # harnesses of one node do not compete for the same cores while they compile.
    index: int = 0
    per_node: int = 1

    @property
    def label(self) -> str:
        return f"ray:{self.host}:{self.device}"


def connect(address: str | None, **init_kwargs: Any) -> bool:
    """Joins the Ray cluster at `address` ("auto" or None: the one this machine runs, else a
    new local instance). True when this call connected (so the caller disconnects), False
    when this process was already connected."""
    import ray

    if ray.is_initialized():
        return False
    ray.init(address=None if address in (None, "auto") else address, ignore_reinit_error=True, **init_kwargs)
    return True


def plan_workers(ray: Any, *, cpu_actors: int = 1) -> list[WorkerSlot]:
    """One slot per GPU of every live node. A cluster with no GPU: `cpu_actors` per node (at
    most its CPUs). Nodes with neither (a head started with --num-cpus 0) get none. A cluster
    with GPUs leaves its CPU-only nodes out: one run's timings come from one kind of device."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    any_gpu = any(int((n.get("Resources") or {}).get("GPU", 0)) > 0 for n in nodes)
    slots: list[WorkerSlot] = []
    for node in nodes:
        resources = node.get("Resources") or {}
        host = node.get("NodeManagerHostname") or node.get("NodeManagerAddress") or node["NodeID"][:8]
        if any_gpu:
            device, count = "cuda", int(resources.get("GPU", 0))
        else:
            device, count = "cpu", min(max(1, cpu_actors), int(resources.get("CPU", 0)))
        slots += [WorkerSlot(node["NodeID"], host, device, i, count) for i in range(count)]
    return slots


_REMOTE: Any = None


MAX_JOBS_PER_ACTOR = 8  # the harness server admits at most 8 jobs per device (gate.default_concurrency)


def start_actor(ray: Any, slot: WorkerSlot, cache_dir: str | None, isolation: str,
                jobs_per_device: int = 0) -> Any:
    """An `_EvalActor` pinned to the slot's node (not moved by Ray: a lost node's work is
    resubmitted by the caller, to actors that are alive). No Ray-side restarts or task retries,
    so an evaluation is never run twice behind the caller's back."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    options: dict[str, Any] = {"num_gpus": 1, "num_cpus": 0} if slot.device == "cuda" else {"num_cpus": 1}
    global _REMOTE
    if _REMOTE is None:  # one actor class, exported to the cluster once
        _REMOTE = ray.remote(_EvalActor)
    # A threaded actor: its one Evaluator takes several evaluate calls at once, and its server
    # overlaps them (admitting as many as it runs; the rest wait in the server's queue).
    return _REMOTE.options(
        **options, max_restarts=0, max_task_retries=0, max_concurrency=MAX_JOBS_PER_ACTOR + 2,
        scheduling_strategy=NodeAffinitySchedulingStrategy(slot.node_id, soft=False),
    ).remote(slot.device, cache_dir, isolation, (slot.index, slot.per_node), jobs_per_device)


class _EvalActor:
    """Lives in a Ray worker: one Evaluator, reused for every job sent to this actor."""

    def __init__(self, device: str, cache_dir: str | None, isolation: str,
                 cpu_share: tuple[int, int] = (0, 1), jobs_per_device: int = 0) -> None:
        from kernelagent.harness import Evaluator
        from kernelagent.harness.caller.pool import split_cpus

        index, count = cpu_share
        cpus = split_cpus(count)[index] if 0 <= index < count else None  # split on the node itself
        self.evaluator = Evaluator(device=device, cache_dir=cache_dir, isolation=isolation, cpus=cpus,
                                   concurrency=jobs_per_device)

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

    def where(self) -> dict:
        """The host and process id of this actor (progress labels; tests kill it by pid)."""
        return {"host": socket.gethostname(), "pid": os.getpid()}

    def close(self) -> None:
        self.evaluator.close()


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
            remote = ray.remote(**options, max_concurrency=MAX_JOBS_PER_ACTOR + 2)(_EvalActor)
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
