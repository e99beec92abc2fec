"""`kernelagent mcp`: serve the harness's tools over the Model Context Protocol (stdio or HTTP).

What the server trusts (mcpserver/roots.py, docs/concepts/isolation.md): problems only from the
--problems folders, as they were when it started; every other file a client names (candidates,
manifests) lies under a --problems or --root folder and is never run as a problem.

Exit codes: 0 on a clean shutdown, 2 bad input (no --problems, a folder that does not exist, a
--root that overlaps a --problems folder, a bad --http address or one that cannot be bound, a
public address without a token, the mcp package missing): one line on stderr; 130 on Ctrl-C.
Over HTTP the server runs on the stack `kernelagent serve` uses (kernelagent/serving): one
bearer-token check, the same limits and statuses. It says on stdout where it listens once it
does, and that it stopped (SIGTERM: exit 0; Ctrl-C: one line on stderr, 130)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kernelagent.cli.core import DaemonOpt, warm_harness


def mcp(
    problems: Annotated[Optional[list[Path]], typer.Option("--problems", metavar="DIR", help="A folder of problems (and manifests) the server trusts, read-only to the client; repeatable, at least one. Its .py files are pinned when the server starts: a problem new or changed since then is refused.", show_default=False)] = None,
    root: Annotated[Optional[list[Path]], typer.Option("--root", metavar="DIR", help="A folder the client may write and name files in (candidates, manifests, plan outputs); repeatable. Nothing in it runs as a problem; it may not overlap a --problems folder.", show_default=False)] = None,
    http: Annotated[Optional[str], typer.Option("--http", metavar="HOST:PORT", help="Serve streamable HTTP at HOST:PORT (path /mcp) instead of stdio.", show_default=False)] = None,
    token: Annotated[Optional[str], typer.Option("--token", metavar="TOKEN", envvar="KERNELAGENT_SERVE_TOKEN", help="HTTP: require 'Authorization: Bearer TOKEN' (needed for a host other than 127.0.0.1).", show_default=False)] = None,
    device: Annotated[str, typer.Option("--device", metavar="DEVICE", help="auto, cpu, cuda or cuda:N.")] = "auto",
    isolation: Annotated[str, typer.Option("--isolation", metavar="auto|bwrap|namespaces|none", help="Sandbox of the harness (see eval --help).")] = "auto",
    max_evaluations: Annotated[Optional[int], typer.Option("--max-evaluations", min=1, metavar="N", help="Evaluations (evaluate, profile, plan, verify) per client session, counted when a call is admitted.", show_default=False)] = None,
    max_gpu_seconds: Annotated[Optional[float], typer.Option("--max-gpu-seconds", min=1.0, metavar="S", help="Seconds of evaluation per client session, reserved when a call is admitted: concurrent calls share them, and a call that runs out is cancelled.", show_default=False)] = None,
    daemon: DaemonOpt = None,
) -> None:
    """Serve kernelagent's tools (read_reference, evaluate, profile, plan, list_problems, verify) over MCP."""
    from kernelagent.cli import run_guarded

    run_guarded(_mcp, problems=problems, root=root, http=http, token=token, device=device, isolation=isolation,
                max_evaluations=max_evaluations, max_gpu_seconds=max_gpu_seconds, daemon=warm_harness(daemon))


def _mcp(*, problems, root, http, token, device, isolation, max_evaluations, max_gpu_seconds,
         daemon: bool = False) -> None:
    import importlib.util

    from kernelagent.devices import check_device
    from kernelagent.errors import UserError

    if importlib.util.find_spec("mcp") is None:
        raise UserError("kernelagent mcp needs the mcp package: pip install 'kernelagent[mcp]'")
    if not problems:
        raise UserError("give --problems DIR: the folder of problems the server trusts (read-only to the client); "
                        "--root DIR names the client's own folders (candidates), which never hold problems")
    for flag, folders in (("--problems", problems), ("--root", root or [])):
        for r in folders:
            if not r.is_dir():
                raise UserError(f"{flag} {r}: not a folder")
    from kernelagent.mcpserver.roots import Roots

    for workspace, trusted in Roots(problems, root or []).overlaps():
        raise UserError(f"--root {workspace} overlaps --problems {trusted}: a folder the client writes must not "
                        "hold (or lie inside) the problems the server trusts")
    if isolation not in ("auto", "bwrap", "namespaces", "none"):
        raise UserError(f"--isolation must be auto, bwrap, namespaces or none (got {isolation!r})")
    device = check_device(device, quiet=True)
    host = port = None
    if http is not None:
        host, _, port_text = http.rpartition(":")
        if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise UserError(f"--http must be HOST:PORT, e.g. 127.0.0.1:8765 (got {http!r})")
        port = int(port_text)
        if not token and host not in ("127.0.0.1", "localhost", "::1"):
            raise UserError(f"--http {http} exposes the server beyond this machine: give --token (or set "
                            "KERNELAGENT_SERVE_TOKEN)")
    from kernelagent.mcpserver.server import build

    server, harness = build(problems, root or [], device=device, isolation=isolation,
                            max_evaluations=max_evaluations, max_seconds=max_gpu_seconds, daemon=daemon)
    try:
        if http is None:
            server.run("stdio")
        else:
            _serve_http(server, host, port, token)
    finally:
        harness.close()


def _serve_http(server, host: str, port: int, token: str | None) -> None:
    """Serve until SIGTERM (a requested stop: exit 0) or Ctrl-C (130), saying so on stdout: one
    line once it listens (its URL), one when it stops."""
    import signal
    import sys

    from kernelagent.cli.core import interrupted
    from kernelagent.errors import UserError
    from kernelagent.mcpserver.http_app import http_server
    from kernelagent.serving import require

    require("kernelagent mcp --http", "mcp")
    try:
        http = http_server(server, host, port, token)
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc}") from None
    bound_host, bound_port = http.server_address[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host

    def ready() -> None:  # from here on SIGTERM and Ctrl-C stop it cleanly
        typer.echo(f"kernelagent mcp: listening on http://{shown}:{bound_port}/mcp "
                   f"({'bearer token required' if token else 'no token: this machine only'})")
        sys.stdout.flush()

    try:
        stopped_by = http.serve_until_signal(ready=ready)
    except KeyboardInterrupt:
        stopped_by = signal.SIGINT
    if stopped_by == signal.SIGINT:  # SIGTERM: a requested stop (0); Ctrl-C: 130
        raise interrupted("kernelagent mcp: interrupted, stopped")
    typer.echo("kernelagent mcp: stopped")
