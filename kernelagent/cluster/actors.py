"""Harness workers on a Ray cluster: where each goes (one per GPU of every node), how to join the
cluster, and the actor itself: one harness `Evaluator` in a Ray worker, reused for every job.

Shared by the reward service's backend (kernelagent/rl/ray_backend.py) and `bench --ray`
(kernelagent/bench/ray_pool.py), which both stand above this module. Only plain dicts
(EvalResult.to_dict) and source text cross between the driver and the actors; the candidate's
process stays inside the actor's harness. Ray is imported only by the calls that need it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


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
    """An `EvalActor` pinned to the slot's node (not moved by Ray: a lost node's work is
    resubmitted by the caller, to actors that are alive). No Ray-side restarts or task retries,
    so an evaluation is never run twice behind the caller's back."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    options: dict[str, Any] = {"num_gpus": 1, "num_cpus": 0} if slot.device == "cuda" else {"num_cpus": 1}
    global _REMOTE
    if _REMOTE is None:  # one actor class, exported to the cluster once
        _REMOTE = ray.remote(EvalActor)
    # A threaded actor: its one Evaluator takes several evaluate calls at once, and its server
    # overlaps them (admitting as many as it runs; the rest wait in the server's queue).
    return _REMOTE.options(
        **options, max_restarts=0, max_task_retries=0, max_concurrency=MAX_JOBS_PER_ACTOR + 2,
        scheduling_strategy=NodeAffinitySchedulingStrategy(slot.node_id, soft=False),
    ).remote(slot.device, cache_dir, isolation, (slot.index, slot.per_node), jobs_per_device)


@runtime_checkable
class RemoteEvaluator(Protocol):
    """What a Ray actor's `evaluate` takes and answers: plain data only (the problem as source
    text with its id, the config as a dict, the result as a dict), since every argument and
    answer crosses Ray's serialisation. A seam of its own, not EvaluatorProtocol: the caller's
    side (rl.ray_backend.RayBackend, bench.ray_pool.RayWorker) turns it back into one."""

    def evaluate(self, problem_source: str, problem_id: str, candidate: str, config: dict | None) -> dict: ...


class EvalActor:
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
        from kernelagent.cluster.sources import problem_from_source

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
