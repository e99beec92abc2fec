"""`kernelagent serve --gpus 0,1 --port 8000`: the HTTP reward service (see kernelagent.rl.service).

It needs Starlette and uvicorn (the `rl` extra): without them, one line and exit 2."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from kernelagent.cli.core import JobsPerGpuOpt, finite, folder, interrupted

class Backend(str, Enum):
    pool = "pool"
    ray = "ray"


class Baseline(str, Enum):
    compile = "compile"
    eager = "eager"


def serve(
    gpus: Annotated[Optional[str], typer.Option("--gpus", metavar="GPUS", help="GPU indices (0,1,...), 'all' (default: every visible GPU), or 'cpu'.", show_default=False)] = None,
    host: Annotated[str, typer.Option("--host", metavar="HOST", help="Address to listen on (0.0.0.0 for other machines).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, metavar="N", help="Port (0: any free one; the line printed at start names it).")] = 8000,
    max_pending: Annotated[int, typer.Option("--max-pending", min=1, metavar="N", help="Completions admitted at once (queued + running); more is answered 429.")] = 256,
    request_timeout: Annotated[float, typer.Option("--request-timeout", min=1.0, metavar="SECONDS", callback=finite(1), help="Seconds a request may take before it is answered 504.")] = 900.0,
    read_timeout: Annotated[float, typer.Option("--read-timeout", min=0.1, metavar="SECONDS", callback=finite(0.1), help="Seconds a client may take to send a request's headers, and again its body (then 408); a connection that sends nothing is closed after it.")] = 60.0,
    cpu_workers: Annotated[int, typer.Option("--cpu-workers", min=1, metavar="N", help="Evaluators when there is no GPU.")] = 1,
    jobs_per_gpu: JobsPerGpuOpt = 0,
    backend: Annotated[Backend, typer.Option("--backend", help="pool: one harness per local GPU; ray: actors over a Ray cluster's GPUs.")] = Backend.pool,
    ray_address: Annotated[Optional[str], typer.Option("--ray-address", metavar="ADDRESS", help="Ray cluster address for --backend ray (default: start or join a local one).", show_default=False)] = None,
    trials: Annotated[int, typer.Option("--trials", min=1, metavar="N", help="Correctness trials per completion.")] = 5,
    eval_config: Annotated[Optional[str], typer.Option("--eval-config", metavar="JSON", help="JSON object of EvalConfig fields, e.g. '{\"target_ms\": 50}'.", show_default=False)] = None,
    compile_weight: Annotated[float, typer.Option("--compile-weight", metavar="X", callback=finite(0), help="α: reward for compiling.")] = 0.5,
    correct_weight: Annotated[float, typer.Option("--correct-weight", metavar="X", callback=finite(0), help="β: reward for being correct.")] = 1.0,
    speed_weight: Annotated[float, typer.Option("--speed-weight", metavar="X", callback=finite(0), help="γ: weight of min(t_base/t, r_max).")] = 1.0,
    r_max: Annotated[float, typer.Option("--r-max", min=0.0, metavar="X", callback=finite(0), help="Cap on the speedup term.")] = 3.0,
    baseline: Annotated[Baseline, typer.Option("--baseline", help="compile (TorchInductor) or eager.")] = Baseline.compile,
    isolation: Annotated[str, typer.Option("--isolation", metavar="auto|bwrap|namespaces|none", help="Sandbox: auto (bubblewrap around the harness where it works, plus per-job namespaces where they work), bwrap (require bubblewrap), namespaces (require per-job namespaces), none (no sandbox; a warning says so).")] = "auto",
    cache_dir: Annotated[Optional[Path], typer.Option("--cache-dir", metavar="DIR", callback=folder, help="Baseline cache (default ~/.cache/kernelagent).", show_default=False)] = None,
    token: Annotated[Optional[str], typer.Option("--token", metavar="TOKEN", envvar="KERNELAGENT_SERVE_TOKEN", help="Require 'Authorization: Bearer TOKEN' on every request (or set $KERNELAGENT_SERVE_TOKEN; RemoteReward reads the same variable). Needed with a --host other than 127.0.0.1.", show_default=False)] = None,
) -> None:
    """Serve rewards over HTTP: POST /reward with a batch, GET /health."""
    from kernelagent.cli import run_guarded

    run_guarded(_serve, gpus=gpus, host=host, port=port, max_pending=max_pending, request_timeout=request_timeout,
                read_timeout=read_timeout, cpu_workers=cpu_workers, backend=backend.value, ray_address=ray_address,
                trials=trials, eval_config=eval_config, compile_weight=compile_weight, correct_weight=correct_weight,
                speed_weight=speed_weight, r_max=r_max, baseline=baseline.value, isolation=isolation,
                cache_dir=cache_dir, token=token, jobs_per_gpu=jobs_per_gpu)


def _serve(*, gpus, host, port, max_pending, request_timeout, read_timeout, cpu_workers, backend, ray_address,
           trials, eval_config, compile_weight, correct_weight, speed_weight, r_max, baseline,
           isolation, cache_dir, token=None, jobs_per_gpu=0) -> None:
    import json
    import signal
    import sys

    from kernelagent.errors import UserError
    from kernelagent.serving import require

    if not token and host not in ("127.0.0.1", "localhost", "::1"):
        raise UserError(f"--host {host} exposes the service beyond this machine: give --token (or set "
                        "$KERNELAGENT_SERVE_TOKEN) so that only your trainers can use it")
    require("kernelagent serve", "rl")  # before any harness starts
    from kernelagent.harness import EvalConfig
    from kernelagent.rl.reward import RewardConfig
    from kernelagent.rl.service import RewardService
    from kernelagent.rl.trl import KernelReward

    try:
        overrides = json.loads(eval_config) if eval_config else {}
        if not isinstance(overrides, dict):
            raise ValueError("not a JSON object")
        config = EvalConfig.from_dict({"trials": trials, **overrides})
    except (ValueError, TypeError) as exc:
        raise UserError(f"--eval-config: {exc}") from None
    reward_config = RewardConfig(compile_weight=compile_weight, correct_weight=correct_weight,
                                 speed_weight=speed_weight, r_max=r_max, baseline=baseline)
    if backend == "ray":
        try:
            from kernelagent.rl.ray_backend import RayBackend
        except ImportError:
            raise UserError("--backend ray needs ray (pip install 'ray[default]')") from None
        engine = RayBackend(address=ray_address, cpu_actors=cpu_workers,
                            cache_dir=str(cache_dir) if cache_dir else None, isolation=isolation,
                            jobs_per_device=jobs_per_gpu)
    else:
        from kernelagent.devices import check_gpu_list
        from kernelagent.harness.caller.pool import EvaluatorPool, parse_gpus

        check_gpu_list(gpus, quiet=True)  # the CPU fallback is named in the "listening" line
        try:
            devices = parse_gpus(gpus)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if devices == ["cpu"]:
            devices = ["cpu"] * cpu_workers
        engine = EvaluatorPool(devices=devices, cache_dir=cache_dir, isolation=isolation,
                               cpu_workers=cpu_workers, jobs_per_device=jobs_per_gpu)
    reward = KernelReward(engine, config=reward_config, eval_config=config, own_backend=True)  # the service closes it
    service = RewardService(reward, max_pending=max_pending, request_timeout=request_timeout,
                            read_timeout=read_timeout, token=token)
    try:
        server = service.make_server(host, port)
    except OSError as exc:
        service.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc}") from None
    bound_host, bound_port = server.server_address[:2]
    devices_text = ",".join(getattr(engine, "devices", [])) or "?"

    def ready() -> None:  # from this line on, SIGTERM is a clean stop (0) and Ctrl-C one too (130)
        jobs = f"{jobs_per_gpu} asked" if jobs_per_gpu else "chosen by each harness from its CPUs and device memory"
        typer.echo(f"kernelagent serve: listening on http://{bound_host}:{bound_port} "
                   f"(backend {backend}, devices {devices_text}, capacity {max_pending}, jobs per device: {jobs})")
        sys.stdout.flush()

    stopped_by = None
    try:  # a stop answers requests in flight 503 + Retry-After, so trainers send them again
        stopped_by = server.serve_until_signal(on_stop=service.stop_accepting, ready=ready)
    except KeyboardInterrupt:
        stopped_by = signal.SIGINT
    finally:
        service.close()
    if stopped_by == signal.SIGINT:  # Ctrl-C: 130, as for every command (SIGTERM is a requested stop: 0)
        raise interrupted("kernelagent serve: interrupted, stopped")
    typer.echo("kernelagent serve: stopped")
