"""The MCP server: the agent's tools for any coding agent, over the official `mcp` SDK.

Tools share the agent's implementations (agent/tools.py `HarnessTools`: the same EvalConfig
settings, the same rendering a model reads), so an MCP client and our loop get one verdict:
- `read_reference(problem)`: the problem's source and its inputs' shapes and dtypes;
- `evaluate(problem, code | candidate, trials, timing, ...)`: compile, correctness, timing
  against eager and TorchInductor, flags (the full trial count: the `submit` tool's settings);
- `profile(problem, code | candidate)`: timings, top kernels, roofline (and ncu on a GPU);
- `plan(problem)`: a whole model's regions (kernelagent plan);
- `list_problems(directory)`: the problems under a directory;
- `verify(manifest, name)`: one kernelagent.toml entry, judged as `kernelagent verify` judges it.

Each returns structured content (its output schema is a JSON object) and a short text.
Problems under the roots are resources (`kernelagent://problem/<path>`); the system and task
prompts of prompts/ are MCP prompts. Long evaluations send progress every few seconds; a
cancelled request aborts the harness server (its job's processes die, the device is free) and
the next request starts a fresh one. Bad arguments, a path outside the roots and a spent budget
are tool errors that say what to fix.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

from typing import TypedDict

from mcp.server.mcpserver import Context, MCPServer  # this module is imported only by `kernelagent mcp`
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent

from kernelagent.mcpserver.session import Roots, Sessions, ToolInputError, timed

PROGRESS_EVERY_S = 2.0
RESULT_FIELDS = ("status", "reason", "compiled", "correct", "speedups", "speedup_intervals", "flags", "timings",
                 "stage_seconds", "candidate_sha256", "kernels", "kernel_evidence")


class Harness:
    """One Evaluator for the server, restarted after a cancellation killed it."""

    def __init__(self, device: str, isolation: str = "auto", cache_dir: str | None = None) -> None:
        self.device, self.isolation, self.cache_dir = device, isolation, cache_dir
        self.lock = threading.Lock()
        self._evaluator: Any = None

    def evaluator(self) -> Any:
        from kernelagent.harness import Evaluator

        with self.lock:
            if self._evaluator is None:
                kwargs = {"device": self.device, "isolation": self.isolation}
                if self.cache_dir:
                    kwargs["cache_dir"] = self.cache_dir
                self._evaluator = Evaluator(**kwargs)
                self._evaluator.start()
            return self._evaluator

    def abort(self) -> None:
        with self.lock:
            evaluator, self._evaluator = self._evaluator, None
        if evaluator is not None:
            evaluator.abort()

    def close(self) -> None:
        with self.lock:
            evaluator, self._evaluator = self._evaluator, None
        if evaluator is not None:
            evaluator.close()


class Evaluation(TypedDict, total=False):
    """evaluate's and profile's structured result: the harness's verdict (EvalResult fields)."""

    verdict: str
    passed: bool
    status: str
    reason: str
    compiled: bool
    correct: bool
    speedups: dict[str, float]
    speedup_intervals: dict[str, list[float]]
    flags: list[dict[str, Any]]
    timings: dict[str, Any]
    stage_seconds: dict[str, float]
    candidate_sha256: str
    kernels: list[dict[str, Any]]
    kernel_evidence: dict[str, Any]
    text: str


def _reply(structured: dict[str, Any], text: str) -> CallToolResult:
    """Structured content for programs, and the short text our own loop shows a model."""
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)


def _result_dict(obs: Any) -> dict[str, Any]:
    data = obs.data or {}
    out = {k: data.get(k) for k in RESULT_FIELDS if k in data}
    out["passed"] = bool(obs.passed)
    out["verdict"] = obs.verdict
    return out


def build(roots: list[str | Path], *, device: str = "auto", isolation: str = "auto", cache_dir: str | None = None,
          max_evaluations: int | None = None, max_seconds: float | None = None) -> tuple[Any, Harness]:
    """(MCPServer, Harness): the server with every tool, resource and prompt registered."""
    from kernelagent.agent.prompts import Prompts
    from kernelagent.agent.tools import HarnessTools, timed_settings

    root_set = Roots(roots)
    sessions = Sessions(max_evaluations, max_seconds)
    harness = Harness(device, isolation, cache_dir)
    prompts = Prompts()
    server = MCPServer("kernelagent", instructions=(
        "Judge GPU kernels with kernelagent's harness: read_reference shows a problem, evaluate runs a "
        "candidate (a Python module defining class ModelNew) in a jail and says whether it is correct and how "
        "fast it is against eager PyTorch and TorchInductor; the verdict cannot be gamed by the candidate."))

    def problem_of(path: str) -> Any:
        from kernelagent.problem import ProblemError, load_problem

        try:
            return load_problem(root_set.resolve(path, "problem"))
        except ProblemError as exc:
            raise ToolInputError(str(exc).replace(str(Path(path).resolve()), path)) from None

    def code_of(code: str | None, candidate: str | None) -> str:
        if code and candidate:
            raise ToolInputError("give `code` (the module's text) or `candidate` (a file under a root), not both")
        if code:
            if not isinstance(code, str) or "ModelNew" not in code:
                raise ToolInputError("`code` must be the complete module text defining class ModelNew")
            return code
        if candidate:
            return root_set.resolve(candidate, "candidate").read_text(encoding="utf-8")
        raise ToolInputError("give `code` (the module defining class ModelNew) or `candidate` (its file)")

    async def run_evaluation(ctx: Context, what: str, fn: Any) -> Any:
        """Run `fn` (blocking) in a thread; progress while it runs; a cancel kills the harness."""
        budget = sessions.budget(_session_key(ctx))
        try:
            budget.reserve()
        except ToolInputError as exc:
            raise ToolError(str(exc)) from None
        started = time.monotonic()
        task = asyncio.get_running_loop().run_in_executor(None, fn)
        try:
            with timed(budget):
                while True:
                    done, _ = await asyncio.wait({task}, timeout=PROGRESS_EVERY_S)
                    if done:
                        return task.result()
                    elapsed = time.monotonic() - started
                    try:
                        await ctx.report_progress(elapsed, None, f"{what}: {elapsed:.0f} s")
                    except Exception:  # noqa: BLE001 - a client without progress support
                        pass
        except asyncio.CancelledError:
            harness.abort()  # the job's processes die with the harness server; the device is free
            raise

    def guard(fn: Any) -> Any:
        try:
            return fn()
        except ToolInputError as exc:
            raise ToolError(str(exc)) from None

    @server.tool(description="List the problem files (KernelBench layout) under a directory inside the roots.")
    def list_problems(directory: str = ".") -> dict[str, Any]:
        def go() -> dict[str, Any]:
            base = Path(directory).expanduser()
            base = base if base.is_absolute() else (root_set.roots[0] / base if root_set.roots else base)
            resolved = root_set.require(base, "directory")
            from kernelagent.rl.dataset import find_problems

            found = [str(p) for p in find_problems(resolved)]
            return _reply({"directory": str(resolved), "problems": found, "count": len(found)},
                          f"{len(found)} problems under {resolved}:\n" + "\n".join(found[:200]))
        return guard(go)

    @server.tool(description="Show a problem: its PyTorch reference source, and the shapes and dtypes of its inputs.")
    def read_reference(problem: str) -> dict[str, Any]:
        def go() -> dict[str, Any]:
            loaded = problem_of(problem)
            tools = HarnessTools(None, loaded, prompts)
            text = tools.run("read_reference", {}).text
            return _reply({"problem": str(loaded.path), "source": loaded.source, "inputs": tools.inputs,
                           "text": text}, text)
        return guard(go)

    @server.tool(description="Evaluate a candidate (a Python module defining class ModelNew, as `code`, or a file "
                             "under a root as `candidate`) against a problem: compile, correctness on several "
                             "input sets, timing against eager PyTorch and TorchInductor with 95% intervals, and "
                             "the harness's flags. The same verdict as `kernelagent eval`.")
    async def evaluate(problem: str, ctx: Context, code: str | None = None, candidate: str | None = None,
                       trials: int = 5, timing: bool = True) -> Evaluation:
        loaded, source = guard(lambda: (problem_of(problem), code_of(code, candidate)))
        if not isinstance(trials, int) or not 1 <= trials <= 100:
            raise ToolError("`trials` must be a whole number from 1 to 100")
        settings = timed_settings(trials) if timing else dict(trials=trials, timing=False, baselines=False)

        def work() -> Any:
            tools = HarnessTools(harness.evaluator(), loaded, prompts, trials=trials)
            return tools._evaluate("evaluate", source, settings)

        obs = await run_evaluation(ctx, "evaluating", work)
        return _reply({**_result_dict(obs), "text": obs.text}, obs.text)

    @server.tool(description="Profile a candidate: its time against eager and TorchInductor, its top kernels with "
                             "their share of device time, and how close it is to the roofline.")
    async def profile(problem: str, ctx: Context, code: str | None = None,
                      candidate: str | None = None) -> Evaluation:
        loaded, source = guard(lambda: (problem_of(problem), code_of(code, candidate)))

        def work() -> Any:
            tools = HarnessTools(harness.evaluator(), loaded, prompts)
            return tools.run("profile", {"code": source})

        obs = await run_evaluation(ctx, "profiling", work)
        return _reply({**_result_dict(obs), "text": obs.text}, obs.text)

    @server.tool(description="Plan a whole model: profile its forward, group its ops into regions ranked by time "
                             "with Amdahl's bound, and write each extractable region as a problem.")
    async def plan(problem: str, ctx: Context, out: str | None = None) -> dict[str, Any]:
        from kernelagent.wholemodel.plan import make_plan, render

        loaded = guard(lambda: problem_of(problem))
        target = Path(out) if out else Path(loaded.path).with_name(f"{Path(loaded.path).stem}_plan")
        guard(lambda: root_set.require(target, "out"))
        dev = "cuda" if harness.device.startswith("cuda") or (harness.device == "auto" and _has_gpu()) else "cpu"
        data = await run_evaluation(ctx, "planning", lambda: make_plan(loaded.path, target, device=dev))
        text = render(data)
        return _reply({"plan": str(target / "plan.json"), "totals": data["totals"],
                       "regions": [{k: r.get(k) for k in ("id", "kind", "ops", "share", "time_us", "amdahl_bound",
                                                          "extractable", "why_not", "problem")}
                                   for r in data["regions"]], "text": text}, text)

    @server.tool(description="Verify one kernel of a kernelagent.toml manifest (under a root) as `kernelagent "
                             "verify` does: correct, and not slower than its lock.")
    async def verify(manifest: str, ctx: Context, name: str | None = None) -> dict[str, Any]:
        path = guard(lambda: root_set.resolve(manifest, "manifest"))

        def work() -> Any:
            from kernelagent.ci.manifest import load_manifest
            from kernelagent.ci.session import open_cached_evaluator
            from kernelagent.ci.verify import run_verify

            loaded = load_manifest(path)
            with open_cached_evaluator(store=None, device=harness.device, cache_dir=None,
                                       isolation=harness.isolation, run_id=f"mcp-verify:{path}") as cached:
                return run_verify(loaded, cached, only=[name] if name else None)

        report = await run_evaluation(ctx, "verifying", work)
        data = json.loads(json.dumps(report.to_dict() if hasattr(report, "to_dict") else dict(report), default=str))
        lines = [f"{k.get('name')}: {'pass' if k.get('passed') else 'FAIL'} {'; '.join(k.get('failures') or [])}"
                 for k in data.get("kernels", [])] or [json.dumps(data)[:2000]]
        return _reply({**data, "text": "\n".join(lines)}, "\n".join(lines))

    # -- resources and prompts ---------------------------------------------------------------
    @server.resource("kernelagent://problems", description="The problem files under the server's roots.")
    def problems_resource() -> str:
        return json.dumps([str(p) for p in root_set.problems()])

    @server.resource("kernelagent://problem/{name}", description="A problem's source, by its file name under a root.")
    def problem_resource(name: str) -> str:
        matches = [p for p in root_set.problems() if p.name == name or p.stem == name]
        if not matches:
            raise ToolError(f"no problem named {name!r} under the roots")
        return matches[0].read_text(encoding="utf-8")

    def device_facts() -> tuple[dict[str, Any], bool]:
        from kernelagent.agent import describe

        fingerprint = harness.evaluator().fingerprint()
        return describe(fingerprint), not fingerprint.get("cuda")

    @server.prompt(description="kernelagent's system prompt (text mode: one ```python block per answer).")
    def system_prompt(backend: str = "triton") -> str:
        facts, cpu = device_facts()
        return prompts.render("system", mode="text", backend=backend, cpu=cpu, device=facts,
                              target_speedup=1.0, max_turns=None, max_tokens=None, max_cost=None, timeout=None)

    @server.prompt(description="kernelagent's task prompt for a problem under the roots: what our loop starts with.")
    def task_prompt(problem: str, backend: str = "triton", target_speedup: str = "1.0") -> str:
        from kernelagent.agent import prompt_context

        loaded = guard(lambda: problem_of(problem))
        tools = HarnessTools(None, loaded, prompts)
        facts, cpu = device_facts()
        context = prompt_context(loaded, mode="text", backend=backend, inputs=tools.inputs, device=facts, cpu=cpu,
                                 target_speedup=float(target_speedup), max_turns=None)
        return prompts.render("task", **context)

    return server, harness


def _session_key(ctx: Any) -> str:
    """One budget per client session: HTTP names it (the Mcp-Session-Id header); a stdio server
    has one client, its process's."""
    try:
        headers = ctx.headers or {}
    except Exception:  # noqa: BLE001 - no transport headers (stdio)
        headers = {}
    return str(headers.get("mcp-session-id") or headers.get("Mcp-Session-Id") or "stdio")


def _has_gpu() -> bool:
    from kernelagent.devices import gpu_indices

    return bool(gpu_indices())
