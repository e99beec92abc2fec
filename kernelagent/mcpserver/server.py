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

What it trusts (roots.py): problems only from the problem roots (`--problems`), as they were
when it started; everything a client sends or names (code, candidate files, manifests, folders)
is untrusted. Candidate code runs only in the harness's jail; problem code the server runs
itself runs in a child with the allowlisted environment, jailed where the jail works
(confined.py). Each call is admitted against its session's budget and cancelled alone
(calls.py). Bad arguments, a path outside the roots, an untrusted problem and a spent budget are
tool errors that say what to fix; a broken trusted problem is a `bad_problem` verdict.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path
from typing import Any, TypedDict

from mcp.server.mcpserver import Context, MCPServer  # this module is imported only by `kernelagent mcp`
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent

from kernelagent.harness import interpreter
from kernelagent.mcpserver.calls import CallEvaluator, Harness, guard, run_call
from kernelagent.mcpserver.roots import BadProblem, Roots
from kernelagent.mcpserver.session import Sessions, ToolInputError

RESULT_FIELDS = ("status", "reason", "compiled", "correct", "speedups", "speedup_intervals", "flags", "timings",
                 "stage_seconds", "candidate_sha256", "kernels", "kernel_evidence")


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


def _result_dict(data: dict[str, Any], passed: bool, verdict: str) -> dict[str, Any]:
    out = {k: data.get(k) for k in RESULT_FIELDS if k in data}
    out["passed"], out["verdict"] = passed, verdict
    return out


def _bad_problem(reason: str, data: dict[str, Any] | None = None) -> CallToolResult:
    """A broken (trusted) problem: no candidate can change that verdict."""
    structured = _result_dict({**(data or {}), "status": "bad_problem", "reason": reason}, False, "bad_problem")
    text = f"bad_problem: {reason}"
    return _reply({**structured, "text": text}, text)


def build(problems: list[str | Path], workspace: list[str | Path] = (), *, device: str = "auto",
          isolation: str = "auto", cache_dir: str | None = None, max_evaluations: int | None = None,
          max_seconds: float | None = None, version: str | None = None,
          daemon: bool | None = None) -> tuple[Any, Harness]:
    """(MCPServer, Harness): the server with every tool, resource and prompt registered, its
    problem roots pinned (roots.py). `version` is what `initialize` reports (default: the
    package's)."""
    from kernelagent.agent.prompts import Prompts
    from kernelagent.agent.tools import HarnessTools, timed_settings
    from kernelagent.mcpserver.confined import Confinement

    root_set = Roots(problems, workspace)
    pinned = root_set.pin()
    print(f"kernelagent mcp: {pinned} problem files pinned under {root_set.describe(True)}"
          + (f" ({root_set.unpinned} left out: too many or too large)" if root_set.unpinned else ""), file=sys.stderr)
    sessions = Sessions(max_evaluations, max_seconds)
    harness = Harness(device, isolation, cache_dir, daemon=daemon)
    confinement = Confinement(root_set.roots, device)
    harness.confinement = confinement  # removed with the harness (cli/mcp_cmd.py closes it)
    outputs = root_set.add_output_root(confinement.outputs)  # after the jail's roots: not hidden from its runs
    confinement.jail()  # probed now, before the server has threads
    prompts = Prompts()
    inputs_of: dict[str, dict[str, Any]] = {}  # a pinned problem's sha256 -> its inputs' description
    server = MCPServer("kernelagent", version=version or package_version(), instructions=(
        "Judge GPU kernels with kernelagent's harness: read_reference shows a problem, evaluate runs a "
        "candidate (a Python module defining class ModelNew) in a jail and says whether it is correct and how "
        "fast it is against eager PyTorch and TorchInductor; the verdict cannot be gamed by the candidate. "
        "Problems come only from the server's problem roots; write candidates where the server's --root allows."))

    def problem_of(path: str) -> Any:
        return root_set.problem(path)

    def code_of(code: str | None, candidate: str | None) -> str:
        if code and candidate:
            raise ToolInputError("give `code` (the module's text) or `candidate` (a file under a root), not both")
        if code:
            if not isinstance(code, str) or "ModelNew" not in code:
                raise ToolInputError("`code` must be the complete module text defining class ModelNew")
            return code
        if candidate:
            return root_set.read_text(candidate, "candidate")
        raise ToolInputError("give `code` (the module defining class ModelNew) or `candidate` (its file)")

    def inputs(loaded: Any, cancel: threading.Event | None = None) -> dict[str, Any]:
        if loaded.sha256 not in inputs_of:
            described = confinement.describe_inputs(loaded, cancel)
            if cancel is not None and cancel.is_set():
                return described
            inputs_of[loaded.sha256] = described
        return inputs_of[loaded.sha256]

    def evaluation(problem: str, run: Any, trials: int = 5) -> Any:
        """(work, None): work(cancel) runs run(tools) -> Observation in a call; (None, reply) for
        a broken problem (a bad_problem verdict). The tools see the problem through a private
        copy of its pinned source (ncu reads a problem by its path: never the client's file)."""
        from kernelagent.problem import ProblemError

        try:
            loaded = confinement.private_copy(problem_of(problem))
        except BadProblem as exc:
            return None, _bad_problem(str(exc))

        def work(cancel: threading.Event) -> Any:
            evaluator = CallEvaluator(harness.evaluator(), cancel)
            tools = HarnessTools(evaluator, loaded, prompts, trials=trials, inputs={})
            try:
                obs = run(tools)
            except ProblemError:  # the harness said bad_problem (or too_large): its verdict, with the reason
                result = evaluator.last
                data = result.to_dict() if result is not None else {}
                if data.get("status") == "too_large":
                    text = f"too_large: {data.get('reason')}"
                    return _reply({**_result_dict(data, False, "too_large"), "text": text}, text)
                return _bad_problem(str(data.get("reason") or "the problem is broken"), data)
            return _reply({**_result_dict(obs.data or {}, bool(obs.passed), obs.verdict), "text": obs.text},
                          obs.text)

        return work, None

    @server.tool(description="List the problems this server runs (found under its problem roots when it started) "
                             "under a directory inside the roots; default: all of them.")
    def list_problems(directory: str = ".") -> dict[str, Any]:
        def go() -> dict[str, Any]:
            under = [root_set.locate(directory, "directory", folder=True)] if directory not in (".", "") \
                else root_set.problem_roots
            found = [str(p) for p in root_set.problems(under)]
            where = ", ".join(str(u) for u in under)
            return _reply({"directory": where, "problems": found, "count": len(found)},
                          f"{len(found)} problems under {where}:\n" + "\n".join(found[:200]))
        return guard(go)

    @server.tool(description="Show a problem: its PyTorch reference source, and the shapes and dtypes of its inputs.")
    async def read_reference(problem: str) -> dict[str, Any]:
        loaded = guard(lambda: _problem_or_error(problem_of, problem))
        cancel = threading.Event()
        try:
            described = await asyncio.get_running_loop().run_in_executor(harness.pool, inputs, loaded, cancel)
        except asyncio.CancelledError:
            cancel.set()
            raise
        tools = HarnessTools(None, loaded, prompts, inputs=described)
        text = tools.run("read_reference", {}).text
        return _reply({"problem": str(loaded.path), "source": loaded.source, "inputs": described, "text": text}, text)

    @server.tool(description="Evaluate a candidate (a Python module defining class ModelNew, as `code`, or a file "
                             "under a root as `candidate`) against a problem: compile, correctness on several "
                             "input sets, timing against eager PyTorch and TorchInductor with 95% intervals, and "
                             "the harness's flags. The same verdict as `kernelagent eval`.")
    async def evaluate(problem: str, ctx: Context, code: str | None = None, candidate: str | None = None,
                       trials: int = 5, timing: bool = True) -> Evaluation:
        source = guard(lambda: code_of(code, candidate))
        if not isinstance(trials, int) or not 1 <= trials <= 100:
            raise ToolError("`trials` must be a whole number from 1 to 100")
        # a timed verdict is what the client shows a person: its wins are audited (EvalConfig.audit_wins)
        settings = {**timed_settings(trials), "audit_wins": True} if timing else \
            dict(trials=trials, timing=False, baselines=False)
        work, early = guard(lambda: evaluation(problem, lambda tools: tools.evaluate_with("evaluate", source, settings),
                                               trials))
        if early is not None:
            return early
        return await run_call(ctx, sessions, harness, "evaluating", work)

    @server.tool(description="Profile a candidate: its time against eager and TorchInductor, its top kernels with "
                             "their share of device time, and how close it is to the roofline.")
    async def profile(problem: str, ctx: Context, code: str | None = None,
                      candidate: str | None = None) -> Evaluation:
        source = guard(lambda: code_of(code, candidate))
        work, early = guard(lambda: evaluation(problem, lambda tools: tools.run("profile", {"code": source})))
        if early is not None:
            return early
        return await run_call(ctx, sessions, harness, "profiling", work)

    @server.tool(description="Plan a whole model: profile its forward, group its ops into regions ranked by time "
                             "with Amdahl's bound, and write each extractable region as a problem (`out`: a folder "
                             "under a root, a relative one taken in the problem's root; default: "
                             "<problem>_plan in the server's own output folder, kept while it runs, never beside "
                             "the problem). The regions written under a --problems folder or the server's "
                             "folder are problems this server runs.")
    async def plan(problem: str, ctx: Context, out: str | None = None) -> dict[str, Any]:
        from kernelagent.mcpserver.confined import copy_out
        from kernelagent.wholemodel.plan import PLAN_TIMEOUT_S, render, warnings

        loaded = guard(lambda: _problem_or_error(problem_of, problem))
        base = root_set.root_of(loaded.path)
        target = outputs / f"{loaded.path.stem}_plan" if out is None else \
            guard(lambda: root_set.target(out, "out", base))
        dev = "cuda" if harness.device.startswith("cuda") or (harness.device == "auto" and _has_gpu()) else "cpu"

        def work(cancel: threading.Event) -> Any:
            run = confinement.run(loaded.source, loaded.path.name,
                                  interpreter.module_argv("kernelagent.wholemodel.child", "plan", "{problem}",
                                                          "--device", dev, "--out", "{scratch}/plan"),
                                  timeout=PLAN_TIMEOUT_S, cancel=cancel, keep="plan")
            try:
                why = run.failure()
                if why:
                    raise ToolInputError(f"the model could not be planned: {why}")
                written, plan_json = copy_out(run, root_set, target, loaded.path)
            finally:
                run.remove()
            if plan_json is None:
                raise ToolInputError("the plan wrote no plan.json")
            return json.loads(plan_json), written

        data, written = await run_call(ctx, sessions, harness, "planning", work)
        said = warnings(data)  # a measurement flagged or unsteady says so, as `kernelagent plan` does
        text = "".join(f"warning: {w}\n" for w in said) + render(data) + \
            f"\nplan: {written.get('plan.json', target / 'plan.json')}"
        if out is None:
            text += ("\nnote: written in the server's own output folder, removed when the server stops; give `out` "
                     "under a --root folder to keep it")
        elif not any(p.is_relative_to(r) for p in written.values() for r in root_set.problem_roots):
            text += ("\nnote: the regions were written under a --root folder, so they are not problems this server "
                     "runs; give `out` under a --problems folder to evaluate them")
        return _reply({"plan": str(written.get("plan.json", target / "plan.json")), "totals": data["totals"],
                       "warnings": said, "unsteady": bool((data["totals"] or {}).get("unsteady")),
                       "regions": [{k: r.get(k) for k in ("id", "kind", "ops", "share", "time_us", "amdahl_bound",
                                                          "noise", "clear_lead", "extractable", "why_not", "problem")}
                                   for r in data["regions"]], "text": text}, text)

    @server.tool(description="Verify the kernels of a kernelagent.toml manifest (under a root) as `kernelagent "
                             "verify` does: correct, and not slower than its lock. Read-only: the lock is not "
                             "written. Its problems must lie under a problem root.")
    async def verify(manifest: str, ctx: Context, name: str | None = None) -> dict[str, Any]:
        from kernelagent.mcpserver import manifests

        checked = guard(lambda: manifests.check(root_set, manifest, name))

        def work(cancel: threading.Event) -> Any:
            return manifests.run(checked, CallEvaluator(harness.evaluator(), cancel), cancel)

        report = await run_call(ctx, sessions, harness, "verifying", work)
        data = json.loads(json.dumps(report.to_dict(), default=str))
        lines = [f"{k.get('name')}: {'pass' if k.get('passed', k.get('status') == 'pass') else 'FAIL'} "
                 f"{'; '.join(k.get('failures') or [])}".rstrip() for k in data.get("kernels", [])] or \
            ["no kernels were verified"]
        return _reply({**data, "text": "\n".join(lines)}, "\n".join(lines))

    # -- resources and prompts ---------------------------------------------------------------
    @server.resource("kernelagent://problems", description="The problems this server trusts (under --problems).")
    def problems_resource() -> str:
        return json.dumps([str(p) for p in root_set.problems()])

    @server.resource("kernelagent://problem/{name}", description="A trusted problem's source, by its file name.")
    def problem_resource(name: str) -> str:
        from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError

        matches = [p for p in root_set.problems() if p.name == name or p.stem == name]
        if not matches:  # names are compared, never joined to a path
            raise ResourceNotFoundError(f"no problem named {name[:200]!r} under the problem roots")
        try:
            return root_set.problem_source(matches[0])
        except ToolInputError as exc:
            raise ResourceError(str(exc)) from None

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

        try:
            loaded = _problem_or_error(problem_of, problem)
        except ToolInputError as exc:  # a protocol error with this message (no traceback in the log)
            from mcp.shared.exceptions import MCPError
            from mcp.types import INVALID_PARAMS

            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
        facts, cpu = device_facts()
        context = prompt_context(loaded, mode="text", backend=backend, inputs=inputs(loaded), device=facts, cpu=cpu,
                                 target_speedup=float(target_speedup), max_turns=None)
        return prompts.render("task", **context)

    return server, harness


def _problem_or_error(problem_of: Any, path: str) -> Any:
    """A trusted problem, or a tool error (a broken one included, with its reason)."""
    try:
        return problem_of(path)
    except BadProblem as exc:
        raise ToolInputError(f"bad_problem: {exc}") from None


def package_version() -> str:
    """The version of the kernelagent that runs (the package's own, which the distribution's
    metadata is built from)."""
    from kernelagent import __version__

    return __version__


def _has_gpu() -> bool:
    from kernelagent.devices import gpu_indices

    return bool(gpu_indices())
