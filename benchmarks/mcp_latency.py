"""One MCP session over stdio against `kernelagent eval` on the same pair (issue 28's GPU report).

A scripted client (the `mcp` SDK's own) starts `kernelagent mcp` as a subprocess, initialises,
then evaluates and profiles a problem/solution pair, twice each; each call is timed from the
client's side. Then `kernelagent eval PROBLEM SOLUTION --json` runs twice as a fresh process on the
same pair. Reported: the session's start, each call's latency and verdict, and each eval's wall.

    python benchmarks/mcp_latency.py ../shared/kernelbench/KernelBench/level1/19_ReLU.py \\
        benchmarks/kernelbench_solutions/level1/19_ReLU.py --out mcp_latency.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path


async def session(problem: Path, solution: Path, device: str, rows: list[dict],
                  tools: tuple[str, ...] = ("evaluate", "evaluate", "profile", "profile")) -> None:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    # The problem's folder is trusted (--problems), the solution's is the client's (--root); where one
    # holds the other, the outer one is the problem folder (a --root may not overlap it, and
    # candidates are read under it too).
    outer, inner = sorted({problem.parent, solution.parent}, key=lambda p: len(p.parts))[0], solution.parent
    if problem.parent.is_relative_to(outer) and inner.is_relative_to(outer):
        args = ["-m", "kernelagent", "mcp", "--device", device, "--problems", str(outer)]
    else:
        args = ["-m", "kernelagent", "mcp", "--device", device, "--problems", str(problem.parent),
                "--root", str(solution.parent)]
    params = StdioServerParameters(command=sys.executable, args=args, env={k: v for k, v in os.environ.items()})
    started = time.monotonic()
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            rows.append({"call": "initialize", "s": round(time.monotonic() - started, 3)})
            for tool in tools:
                t = time.monotonic()
                result = await s.call_tool(tool, {"problem": str(problem), "candidate": str(solution)},
                                           read_timeout_seconds=900)
                data = result.structured_content or {}
                rows.append({"call": f"mcp {tool}", "s": round(time.monotonic() - t, 3), "status": data.get("status"),
                             "speedups": data.get("speedups"), "error": text(result) if result.is_error else None})
                print(rows[-1], flush=True)


def text(result) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)[:500]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problem", type=Path)
    parser.add_argument("solution", type=Path)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=Path("mcp_latency.json"))
    parser.add_argument("--evals", type=int, default=2, help="fresh `kernelagent eval` runs to compare with")
    parser.add_argument("--calls", default="evaluate,evaluate,profile,profile",
                        help="the tools called in the session, in order (comma-separated: evaluate, profile)")
    args = parser.parse_args()
    tools = tuple(t for t in args.calls.split(",") if t)
    if not tools or set(tools) - {"evaluate", "profile"}:
        parser.error("--calls: a comma-separated list of evaluate and profile")
    problem, solution = args.problem.resolve(), args.solution.resolve()
    rows: list[dict] = []
    asyncio.run(session(problem, solution, args.device, rows, tools))
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    for _ in range(args.evals):
        t = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "kernelagent", "eval", str(problem), str(solution), "--json",
                               "--device", args.device], capture_output=True, text=True, timeout=900)
        wall = time.monotonic() - t
        try:
            status = json.loads(proc.stdout.strip().splitlines()[-1]).get("status")
        except (json.JSONDecodeError, IndexError):
            status = f"exit {proc.returncode}"
        rows.append({"call": "kernelagent eval (fresh process)", "s": round(wall, 3), "status": status})
        print(rows[-1], flush=True)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
