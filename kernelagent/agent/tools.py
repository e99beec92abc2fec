"""The agent's tools, built on the evaluation harness, and their function-calling schemas.

`HarnessTools` is the `ToolExecutor` the loop uses (and the RL environment can reuse):
every tool that takes a candidate evaluates it in the harness's isolated processes, and the
model sees the harness's real verdict rendered through `prompts/tool_result.j2`.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import TYPE_CHECKING, Any

from kernelagent.agent.loop import FormatError, Observation, check_target
from kernelagent.agent.prompts import Prompts
from kernelagent.problem import ProblemError

if TYPE_CHECKING:
    from kernelagent.harness import EvaluatorProtocol

CODE_PARAM = {
    "type": "string",
    "description": "The complete Python module defining `class ModelNew(nn.Module)` and its "
                   "Triton kernels. Leave out to reuse your most recent candidate.",
}


def _schema(name: str, description: str, with_code: bool = True) -> dict:
    params: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
    if with_code:
        params["properties"]["code"] = CODE_PARAM
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": params}}


TOOL_SCHEMAS = [
    _schema("read_reference", "Show the reference PyTorch problem: its source, and the shapes "
            "and dtypes of its inputs and constructor arguments.", with_code=False),
    _schema("compile", "Load the candidate and run its first forward call (Triton compiles "
            "here). Fast; reports import, syntax and compile errors compactly. No correctness "
            "check."),
    _schema("run_tests", "Check the candidate's outputs against the reference on several "
            "random inputs (and other distributions); reports each trial."),
    _schema("profile", "Time the candidate against eager PyTorch and TorchInductor "
            "(torch.compile), list its top kernels with their share of the time, and say how close it "
            "is to the roofline (achieved bandwidth / FLOP/s vs the GPU's peaks) plus Nsight Compute "
            "metrics (DRAM/SM throughput, occupancy, registers, shared memory, stall reasons) where "
            "available."),
    _schema("submit", "Submit the candidate as your final answer. It is verified with the "
            "full number of correctness trials and timed; if it passes, the run ends."),
]
TOOL_NAMES = [s["function"]["name"] for s in TOOL_SCHEMAS]


def tool_schemas(backend: str = "triton") -> list[dict]:
    """The schemas for a backend: the same tools, worded for CUDA C++ when backend is cuda."""
    if backend != "cuda":
        return TOOL_SCHEMAS
    import copy

    schemas = copy.deepcopy(TOOL_SCHEMAS)
    for schema in schemas:
        fn = schema["function"]
        code = fn["parameters"]["properties"].get("code")
        if code is not None:
            code["description"] = ("The complete Python module defining `class ModelNew(nn.Module)` and "
                                   "building its CUDA kernels with torch.utils.cpp_extension.load_inline. "
                                   "Leave out to reuse your most recent candidate.")
        if fn["name"] == "compile":
            fn["description"] = ("Build the candidate's CUDA extension (nvcc; cached by source) and run its "
                                 "first forward call. Reports compiler errors compactly (first errors with "
                                 "their source lines). No correctness check.")
    return schemas

# Shapes and dtypes of the problem's inputs, computed on the meta device in a child process
# (no memory is allocated and the user's file never runs in the agent's process).
DESCRIBE_INPUTS = r"""
import importlib.util, json, sys
import torch
spec = importlib.util.spec_from_file_location("kernelagent_reference", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
def desc(x):
    if isinstance(x, torch.Tensor):
        return f"Tensor(shape={tuple(x.shape)}, dtype={str(x.dtype).replace('torch.', '')})"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(desc(v) for v in x) + "]"
    return repr(x)[:80]
out = {}
for fn in ("get_inputs", "get_init_inputs", "get_smoke_inputs", "get_smoke_init_inputs"):
    if hasattr(mod, fn):
        try:
            with torch.device("meta"):
                out[fn] = [desc(v) for v in getattr(mod, fn)()]
        except Exception as exc:
            out[fn] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
print("KERNELAGENT_INPUTS " + json.dumps(out))
"""


def describe_inputs(problem_path: str, timeout: float = 120.0) -> dict[str, Any]:
    """{"get_inputs": ["Tensor(shape=(..), dtype=float32)", ...], ...}, or {"error": ...}."""
    from kernelagent.harness import interpreter

    try:
        proc = subprocess.run(interpreter.code_argv(DESCRIBE_INPUTS, str(problem_path)),
                              capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"inputs": {"error": f"could not inspect the inputs: {exc}"}}
    for line in proc.stdout.splitlines():
        if line.startswith("KERNELAGENT_INPUTS "):
            return json.loads(line.split(" ", 1)[1])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"inputs": {"error": f"could not inspect the inputs: {tail[:300]}"}}


def timed_settings(trials: int, profile: bool = False) -> dict[str, Any]:
    """The EvalConfig fields of every timed tool: `profile`, `submit`, text mode's evaluation and
    the final verification. One function, so the candidate and its baselines are timed the same
    way whichever tool asks: the same timer, loop, warm-up, L2 flush, Inductor modes and baseline
    cache key (EvalConfig.timing_key). Only the number of correctness trials differs, and
    `profile` adds a torch.profiler pass that runs after the timed loop, never inside it.

    Why (issue 13): in a scripted run on an H200 the same kernel read 0.86x vs Inductor in
    `profile` and 1.12x in `submit`. Both paths already shared the timing settings; what differs
    is that each tool call is a fresh process (the candidate's median moves between processes,
    most on problems whose timed loop is cut to a few calls to keep their outputs), and that the
    first timed tool times the baselines while later ones reuse them from the cache. The model
    was shown point estimates only. Both tools now show the 95% interval and the target is decided
    on its low end (loop.check_target), so a swing inside the noise no longer flips the verdict;
    tests/test_agent.py checks that the two tools' configs cannot drift apart."""
    return dict(trials=trials, timing=True, baselines=True, profile=profile)


class HarnessTools:
    """Tools over an `Evaluator` and one problem. Keeps the last candidate, so `code` may
    be left out. `eval_overrides` are EvalConfig fields applied to every evaluation."""

    def __init__(self, evaluator: EvaluatorProtocol | None, problem: Any, prompts: Prompts, *, trials: int = 5,
                 quick_trials: int = 2, target_speedup: float = 1.0,
                 eval_overrides: dict[str, Any] | None = None,
                 inputs: dict[str, Any] | None = None, use_ncu: bool | str = "auto",
                 ncu_timeout: float = 120.0) -> None:
        self.evaluator, self.problem, self.prompts = evaluator, problem, prompts
        self.trials, self.quick_trials = trials, min(quick_trials, trials)
        self.target_speedup = target_speedup
        self.eval_overrides = dict(eval_overrides or {})
        self._inputs = inputs
        self.last_code: str | None = None
        self.backend = str(self.eval_overrides.get("backend", "triton"))
        self.use_ncu, self.ncu_timeout = use_ncu, ncu_timeout

    @property
    def inputs(self) -> dict[str, Any]:
        if self._inputs is None:
            self._inputs = describe_inputs(str(self.problem.path))
        return self._inputs

    def schemas(self) -> list[dict]:
        return tool_schemas(self.backend)

    # -- ToolExecutor ------------------------------------------------------------------
    def run(self, name: str, arguments: dict) -> Observation:
        if name not in TOOL_NAMES:
            raise FormatError(f"unknown tool `{name}`; the tools are: {', '.join(TOOL_NAMES)}",
                              kind="unknown_tool")
        if name == "read_reference":
            text = self.prompts.render("tool_result", tool=name, problem_name=self.problem.name,
                                       reference_source=self.problem.source, inputs=self.inputs)
            return Observation(text=text)
        code = arguments.get("code")
        if code is not None and not isinstance(code, str):
            raise FormatError("`code` must be a string holding the complete module",
                              kind="bad_arguments")
        if not code:
            if self.last_code is None:
                raise FormatError(f"`{name}` needs `code`: no candidate has been given yet",
                                  kind="bad_arguments")
            code = self.last_code
        self.last_code = code
        settings = {
            "compile": dict(trials=1, compile_only=True, timing=False, baselines=False),
            "run_tests": dict(trials=self.quick_trials, timing=False, baselines=False),
            "profile": timed_settings(self.quick_trials, profile=True),
            # the model's final answer, which the run's summary may show a person as a win
            "submit": {**timed_settings(self.trials), "audit_wins": True},
        }[name]
        return self.evaluate_with(name, code, settings, submitted=(name == "submit"))

    def evaluate(self, code: str) -> Observation:
        """Text mode: everything at once (compile, full correctness, timing)."""
        self.last_code = code
        return self.evaluate_with("evaluate", code, timed_settings(self.trials))

    def verify(self, code: str, *, audit: bool = False) -> Observation:
        """The final verification (full trials, timed): a win is audited by Nsight Compute
        (EvalConfig.audit_wins), and with `audit` the result is, whatever it is."""
        return self.evaluate_with("verify", code, {**timed_settings(self.trials), "audit_wins": True, "audit": audit})

    def evaluate_with(self, tool: str, code: str, settings: dict, *, submitted: bool = False) -> Observation:
        """Evaluate `code` under `settings` (EvalConfig fields over the run's overrides) and
        render it as tool `tool`'s answer: what every tool above, and the MCP server's
        `evaluate` tool, run."""
        from kernelagent.harness import EvalConfig, Status

        config = EvalConfig(**{**self.eval_overrides, **settings})
        start = time.monotonic()
        try:
            result = self.evaluator.evaluate(self.problem, code, config)
        except Exception as exc:  # the harness's fault, not the candidate's: tell, go on
            seconds = time.monotonic() - start
            return Observation(text=f"[{tool}] harness error (not your fault): "
                               f"{type(exc).__name__}: {exc}", verdict="harness_error",
                               code=code, seconds=seconds)
        seconds = time.monotonic() - start
        if result.status in (Status.BAD_PROBLEM, Status.TOO_LARGE):  # no kernel can change either
            raise ProblemError(f"{self.problem.path}: {result.reason or 'the problem is broken'}")
        timed = "candidate" in result.timings
        measurable = timed and all(t.meaningful for t in result.timings.values())
        obs = Observation(
            text="", verdict=result.status, code=code, passed=bool(result.passed), timed=timed,
            measurable=measurable, speedups=dict(result.speedups),
            intervals={k: list(v) for k, v in result.speedup_intervals.items()} if measurable else {},
            full=config.trials >= self.trials and timed,
            submitted=submitted, seconds=seconds, data=result.to_dict())
        target = None
        if obs.passed and timed:
            met, label = check_target(obs, self.target_speedup)
            target = {"met": met, "label": label}
        log = "" if result.passed or not result.log else _tail(result.log, 40)
        template = "feedback" if tool == "evaluate" else "tool_result"
        note = self._analysis(result, code) if tool == "profile" else ""
        obs.text = self.prompts.render(template, tool=tool if tool != "verify" else "submit",
                                       result=result, log=log, target=target, note=note,
                                       error="")
        return obs


    def _analysis(self, result: Any, code: str) -> str:
        """The profile tool's few lines: roofline fraction and, where possible, ncu metrics."""
        try:
            from kernelagent.harness import Status
            from kernelagent.harness.caller import profiling
            from kernelagent.harness.cuda_source import kernel_base_name

            roof = profiling.roofline(result)
            ncu = None
            if self.use_ncu and (result.fingerprint or {}).get("cuda"):
                if result.status == Status.CORRECT and result.passed:
                    names = [k["name"] for k in result.kernels if k.get("own")][:3] or \
                        [k["name"] for k in result.kernels[:2]]
                    dev = getattr(self.evaluator, "visible_devices", None)
                    ncu = profiling.run_ncu(self.problem.path, code, backend=self.backend,
                                            device=f"cuda:{dev}" if dev is not None else "cuda:0",
                                            kernel_names=sorted({kernel_base_name(n) for n in names}),
                                            timeout=self.ncu_timeout,
                                            cache_dir=getattr(self.evaluator, "cuda_cache_dir", None),
                                            candidate_sha=result.candidate_sha256)
                else:
                    ncu = {"unavailable": "skipped: Nsight Compute runs only on correct, unflagged candidates"}
            elif self.use_ncu:
                ncu = {"unavailable": "no GPU here: Nsight Compute metrics need one"}
            lines = [line for line in profiling.summary_lines(result, roof, ncu)
                     if not line.startswith(("time:", "top "))]  # those are in the verdict above
            return "analysis:\n" + "\n".join(lines) if lines else ""
        except Exception as exc:  # noqa: BLE001 - the analysis must never break the tool
            return f"analysis unavailable: {type(exc).__name__}: {exc}"


def _tail(text: str, lines: int) -> str:
    rows = text.rstrip().splitlines()
    if len(rows) <= lines:
        return "\n".join(rows)
    return "\n".join([f"[... {len(rows) - lines} earlier lines cut ...]"] + rows[-lines:])
