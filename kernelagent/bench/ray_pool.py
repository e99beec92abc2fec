"""`bench --ray`: the bench's evaluators as Ray actors, one harness per GPU on every node.

    pool = RayPool("auto", cpu_workers=2, cache_dir=None, isolation="auto")
    Dispatcher(pool, store, run_id, progress)   # the same dispatcher as the local pool's

The actors are the ones the reward service uses too (`kernelagent.cluster.actors.EvalActor`): each holds one
harness `Evaluator`, so the candidate's process lives inside that worker's harness exactly as
on one machine. Only source text goes out and only plain dicts (EvalResult.to_dict) come
back; the SQLite store stays with the driver (the Dispatcher writes it).

A lost worker (its node gone, its process killed) raises `WorkerLost` from `evaluate`: the
Dispatcher hands the evaluation to another worker and asks `revive` for a new actor on the
same node, which works only while the node is alive. Ray itself neither restarts the actors
nor retries their tasks, so no evaluation runs twice without the driver knowing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernelagent.bench.dispatch import WorkerLost
from kernelagent.errors import UserError

if TYPE_CHECKING:
    from kernelagent.problem import Problem
    from kernelagent.harness import EvalConfig

START_TIMEOUT_S = 300.0  # a worker whose actor is not up by then (no room on its node) is an error


def _lost_errors(ray: Any) -> tuple[type[BaseException], ...]:
    import ray.exceptions as rex

    names = ("RayActorError", "ActorDiedError", "ActorUnavailableError", "NodeDiedError", "WorkerCrashedError",
             "ObjectLostError", "OwnerDiedError", "LocalRayletDiedError", "ActorUnschedulableError")
    return tuple(getattr(rex, n) for n in names if hasattr(rex, n))


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs the ray package: pip install 'kernelagent[rl]' "
                        "(on the driver and on every worker)") from None
    return ray


class RayWorker:
    """One actor on one node, seen by the Dispatcher like a harness Evaluator."""

    def __init__(self, ray: Any, slot: Any, cache_dir: str | None, isolation: str, jobs_per_device: int = 0):
        import threading

        self._ray, self.slot, self._cache_dir, self._isolation = ray, slot, cache_dir, isolation
        self._jobs_per_device = jobs_per_device
        self._lost = _lost_errors(ray)
        self.revived = 0
        # Several job threads share this worker (its server runs several jobs at once): the
        # first to see the actor lost revives it, the others find it revived already.
        self._revive_lock = threading.Lock()
        self._broken = False
        self.actor = self._start()

    def _start(self) -> Any:
        from kernelagent.cluster.actors import start_actor

        return start_actor(self._ray, self.slot, self._cache_dir, self._isolation,
                           jobs_per_device=self._jobs_per_device)

    def fingerprint(self) -> dict[str, Any]:
        try:
            return self._ray.get(self.actor.fingerprint.remote(), timeout=START_TIMEOUT_S)
        except self._ray.exceptions.GetTimeoutError:
            raise UserError(f"the Ray worker on {self.slot.host} did not start within {START_TIMEOUT_S:.0f} s "
                            "(no free GPU/CPU there, or kernelagent is not installed on that node)") from None

    def where(self) -> dict[str, Any]:
        return self._ray.get(self.actor.where.remote(), timeout=60)

    def evaluate(self, problem: Problem, source: str, config: EvalConfig | None) -> dict[str, Any]:
        actor = self.actor
        ref = actor.evaluate.remote(problem.source, problem.display, source,
                                    config.to_dict() if config is not None else None)
        try:
            result = self._ray.get(ref)
        except self._lost as exc:
            with self._revive_lock:
                if actor is self.actor:
                    self._broken = True
            raise WorkerLost(f"{self.slot.label}: {type(exc).__name__}") from None
        if not isinstance(result, dict):  # only plain dicts come back from a worker
            return {"status": "harness_error", "reason": f"the Ray worker answered a {type(result).__name__}"}
        return result

    def revive(self) -> bool:
        """A new actor on the same node, if that node is still alive (its old one is gone)."""
        with self._revive_lock:
            if not self._broken:
                return True  # another job thread of this worker revived it already
            revived = self._revive()
            self._broken = not revived
            return revived

    def _revive(self) -> bool:
        alive = {n["NodeID"] for n in self._ray.nodes() if n.get("Alive")}
        if self.slot.node_id not in alive or self.revived >= 3:
            return False
        try:
            self._ray.kill(self.actor)
        except Exception:  # noqa: BLE001 - it is dead already
            pass
        self.revived += 1
        self.actor = self._start()
        try:
            self._ray.get(self.actor.fingerprint.remote(), timeout=START_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - the node went too, or has no room: this slot ends
            try:
                self._ray.kill(self.actor)  # not left waiting for room on a node that is gone
            except Exception:  # noqa: BLE001
                pass
            return False
        return True

    def close(self) -> None:
        try:
            self._ray.get(self.actor.close.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - a lost actor has nothing to close
            pass
        try:
            self._ray.kill(self.actor)
        except Exception:  # noqa: BLE001
            pass


class RayPool:
    """The cluster's workers, in the shape of harness.caller.pool.EvaluatorPool that the
    Dispatcher uses: `devices`, `evaluators`, `size`, `close()`."""

    def __init__(self, address: str, *, cpu_workers: int = 1, cache_dir: str | None = None,
                 isolation: str = "auto", init_kwargs: dict[str, Any] | None = None, jobs_per_device: int = 0):
        from kernelagent.cluster.actors import connect, plan_workers

        ray = import_ray()
        self._ray = ray
        try:
            self._connected = connect(address, log_to_driver=False, **(init_kwargs or {}))
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise UserError(f"could not join the Ray cluster at {address}: "
                            f"{(str(exc).strip().splitlines() or [type(exc).__name__])[0]}") from None
        try:
            slots = plan_workers(ray, cpu_actors=cpu_workers)
            if not slots:
                raise UserError(f"the Ray cluster at {address} has no node with a GPU or a CPU for a harness")
            self.evaluators = [RayWorker(ray, slot, cache_dir, isolation, jobs_per_device) for slot in slots]
        except BaseException:
            self._disconnect()
            raise
        self.devices = [w.slot.label for w in self.evaluators]

    @property
    def size(self) -> int:
        return len(self.evaluators)

    def _disconnect(self) -> None:
        if self._connected:  # a local instance this run started stops here; a cluster stays up
            self._ray.shutdown()
            self._connected = False

    def close(self) -> None:
        """After the Dispatcher has closed every worker (each from its own device thread)."""
        for worker in self.evaluators:
            try:
                self._ray.kill(worker.actor)
            except Exception:  # noqa: BLE001
                pass
        self._disconnect()

    def __enter__(self) -> "RayPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
