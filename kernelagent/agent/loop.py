"""The agent loop: ask the model, run what it asks for, show it the results, repeat.

It depends on two protocols only: a `Model` (kernelagent.models.base) and a
`ToolExecutor` (below). Control flow uses three exceptions: `Submitted` (a verified
candidate ends the run), `LimitsExceeded` (the budget is spent) and `FormatError` (the
reply cannot be acted on; the model is told and the loop goes on).

Modes: "tools" (function calling), "text" (the model answers with one ```python block,
which is evaluated in full and the results come back as the next user message), "auto"
(tools, but a reply with a code block and no tool call is evaluated as in text mode).

Stopping: a correct candidate that meets the target (speedup vs TorchInductor, else vs
eager; decided on the LOW end of its 95% interval, `EvalResult.speedup_intervals`, and on
the point estimate only where no interval was measured, which the label says) ends the run; so does `submit` of a correct candidate (one short of the target is
pushed back once while budget is left). On the CPU timings mean nothing, so a correct,
timed candidate counts as meeting the target ("not measurable on CPU"). At the end the
best correct candidate (by measured speedup; without measurements, the submitted one, else
the latest) is re-verified with the full trial count before success is declared.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from kernelagent.agent.budget import Budget, LimitsExceeded
from kernelagent.agent.prompts import Prompts, truncate
from kernelagent.agent.trajectory import Trajectory
from kernelagent.errors import EXIT_MODEL_UNAVAILABLE
from kernelagent.harness import bounded_json
from kernelagent.models.base import Model, ModelConfigError, ModelError, ModelReply

__all__ = ["Agent", "AgentConfig", "FormatError", "LimitsExceeded", "Observation", "RunResult",
           "Submitted", "ToolExecutor", "check_target", "decision_speed", "extract_code"]


class Submitted(Exception):
    """A correct candidate ends the run. `reason`: "target_met" or "submitted"."""

    def __init__(self, message: str, reason: str = "submitted") -> None:
        super().__init__(message)
        self.reason = reason


class FormatError(Exception):
    """The model's reply or tool call cannot be acted on. `kind` picks the message."""

    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class Observation:
    """What one tool call (or one text-mode evaluation) produced."""

    text: str  # what the model is shown
    verdict: str = "ok"  # short status: harness status, "error", "bad_arguments", ...
    code: str | None = None  # the candidate evaluated, if any
    passed: bool = False  # the candidate passed every correctness check
    timed: bool = False  # the candidate was timed
    measurable: bool = False  # ... and the timings mean something (not CPU/interpreter)
    speedups: dict[str, float] = field(default_factory=dict)  # "eager"/"compile" -> x
    # The 95% interval of each speedup ([low, high], EvalResult.speedup_intervals): the target
    # is decided on its low end (harness/stats.py `beats`).
    intervals: dict[str, list[float]] = field(default_factory=dict)
    full: bool = False  # checked with the full trial count
    submitted: bool = False
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)  # the harness verdict, for the record


def unaudited_gpu_result(obs: Observation) -> bool:
    """A GPU evaluation whose kernel evidence was the trace alone: no Nsight Compute session
    judged it (an audit, the evidence under `--evidence ncu`, or the trace's fallback)."""
    data = obs.data if isinstance(obs.data, dict) else {}
    if not (data.get("fingerprint") or {}).get("cuda"):
        return False
    evidence = data.get("kernel_evidence") if isinstance(data.get("kernel_evidence"), dict) else {}
    return evidence.get("role") not in ("audit", "primary", "fallback")


@runtime_checkable
class ToolExecutor(Protocol):
    """The agent's tools. Their `evaluate(code)` is a seam of its own, one floor above the
    harness's EvaluatorProtocol: it takes the model's code for the run's problem and answers
    what the model is shown (an Observation), not a verdict object."""

    def schemas(self) -> list[dict]: ...  # function-calling schemas
    def run(self, name: str, arguments: dict) -> Observation: ...  # may raise FormatError
    def evaluate(self, code: str) -> Observation: ...  # text mode: compile, tests, timing
    def verify(self, code: str, *, audit: bool = False) -> Observation: ...  # full trials, timed; audited


@dataclass
class AgentConfig:
    mode: str = "auto"  # tools | text | auto
    target_speedup: float = 1.0
    max_output_chars: int = 8000  # longer tool output is cut to head and tail
    max_output_lines: int = 200
    verify_candidates: int = 3  # how many ranked candidates the final check may try


@dataclass
class RunResult:
    outcome: str  # "success" | "short_of_target" | "no_correct_kernel" | "model_unavailable"
    exit_code: int  # 0 | 3 | 1 | 5
    stop_reason: str  # "target_met" | "submitted" | "limits" | "model_error"
    stop_detail: str
    best: Observation | None
    target_check: str
    tool_seconds: dict[str, float]
    tool_calls: dict[str, int]


def decision_speed(obs: Observation) -> tuple[str | None, float | None, list[float] | None]:
    """(baseline, point, interval) the target is judged on: TorchInductor (default mode), else
    eager; interval None when none was measured."""
    base = "compile" if "compile" in obs.speedups else ("eager" if "eager" in obs.speedups else None)
    if base is None:
        return None, None, None
    interval = obs.intervals.get(base)
    return base, obs.speedups[base], (list(interval) if interval and len(interval) == 2 else None)


def check_target(obs: Observation, target: float) -> tuple[bool, str]:
    """(met, label) for a correct, timed candidate. Met when the LOW end of the speedup's 95%
    interval reaches the target (harness/stats.py `beats`): a kernel whose point estimate beats
    TorchInductor only by noise does not stop the run. Without an interval the point estimate
    decides, and the label says so."""
    from kernelagent.harness.stats import beats

    if not obs.passed:
        return False, "not correct"
    if not obs.timed:
        return False, "not timed yet"
    if not obs.measurable:
        return True, "not measurable on CPU"
    base, value, interval = decision_speed(obs)
    if base is None or value is None:
        return False, "no baseline timing"
    name = "TorchInductor" if base == "compile" else "eager (no TorchInductor baseline)"
    met = beats(interval, value, target)
    if interval is not None:
        return met, (f"{value:.3f}x [{interval[0]:.3f}, {interval[1]:.3f}] vs {name}, target {target:g}x "
                     f"on the lower bound: {'met' if met else 'not met'}")
    return met, (f"{value:.3f}x vs {name}, target {target:g}x: {'met' if met else 'not met'} "
                 "(point estimate: no interval measured)")


FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str:
    """The last fenced code block that defines `class ModelNew`; FormatError if none."""
    blocks = [b for b in FENCE.findall(text or "") if "class ModelNew" in b]
    if blocks:
        return blocks[-1].strip() + "\n"
    if (text or "").count("```") % 2 == 1 and "class ModelNew" in text:
        raise FormatError("code block not closed", kind="unclosed_block")
    raise FormatError("no code block with class ModelNew", kind="no_action")


def sha(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()[:16]


class Agent:
    def __init__(self, model: Model, tools: ToolExecutor, prompts: Prompts, budget: Budget,
                 trajectory: Trajectory, config: AgentConfig,
                 observer: Callable[..., None] | None = None) -> None:
        self.model, self.tools, self.prompts = model, tools, prompts
        self.budget, self.trajectory, self.config = budget, trajectory, config
        self.notify = observer or (lambda event, **data: None)
        self.candidates: dict[str, tuple[Observation, int]] = {}  # sha -> (best obs, turn)
        self.short_submits = 0
        self.tool_seconds: dict[str, float] = defaultdict(float)
        self.tool_calls: dict[str, int] = defaultdict(int)
        self.judged = 0  # kernels the model wrote that the harness judged

    # -- conversation ------------------------------------------------------------------
    @property
    def messages(self) -> list[dict]:
        return self.trajectory.messages

    def add(self, role: str, content: str, **extra: Any) -> None:
        self.trajectory.add_message({"role": role, "content": content, **extra})

    def run(self, system: str, task: str) -> RunResult:
        self.add("system", system)
        self.add("user", task)
        self.trajectory.save()
        try:
            while True:
                self.step()
        except Submitted as exc:
            stop = (exc.reason, str(exc))
        except LimitsExceeded as exc:
            stop = ("limits", str(exc))
        except ModelConfigError:  # bad key or model name: the user's to fix (exit 2)
            raise
        except ModelError as exc:
            stop = ("model_error", str(exc))
        self.notify("stop", reason=stop[0], detail=stop[1])
        return self.finish(*stop)

    def seed(self, obs: Observation) -> None:
        """Start from an existing kernel (regeneration): its verdict is recorded as step 0 and,
        when it passes, it is a candidate from the start, so the run never ends with less than
        it began with. It does not end the run by itself: the model still gets its turns."""
        self.trajectory.add_step({"turn": 0, "model": None, "initial": True,
                                  "observations": [self.record(obs, "initial", None, None)],
                                  "budget": self.budget.snapshot()})
        if obs.passed and obs.code:
            self.candidates[sha(obs.code)] = (obs, 0)
        self.notify("tool", tool="initial", obs=obs, best=self.best(), turn=0)

    def step(self) -> None:
        self.budget.check()
        mode = self.config.mode
        messages = copy.deepcopy(self.messages)  # a client may not alter the record
        reply = self.model.query(messages, None if mode == "text" else self.tools.schemas())
        self.budget.charge(reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.cost_usd)
        turn = self.budget.turns
        self.notify("model", turn=turn, reply=reply, budget=self.budget.snapshot())
        record: dict[str, Any] = {"turn": turn, "model": {**reply.to_dict(), "raw": reply.raw},
                                  "observations": []}
        stop = None
        if reply.tool_calls and mode != "text":
            self.trajectory.add_message(self.history_message(reply))
            for call in reply.tool_calls:
                obs = self.call_tool(call.name, call.arguments_json)
                stop = self.judge(obs, turn) or stop
                self.count(call.name, obs)
                self.add("tool", self.cut(obs.text), tool_call_id=call.id)
                record["observations"].append(self.record(obs, call.name, call.arguments_json, call.id))
        else:
            self.add("assistant", reply.content)
            try:
                if mode == "tools":
                    raise FormatError("no tool call", kind="no_action")
                obs = self.tools.evaluate(extract_code(reply.content))
                stop = self.judge(obs, turn)
                self.count("evaluate", obs)
                self.add("user", self.cut(obs.text))
            except FormatError as exc:
                obs = Observation(text=self.format_error(exc), verdict=exc.kind)
                self.add("user", obs.text)
                self.notify("tool", tool="reply", obs=obs, best=self.best(), turn=turn)
            record["observations"].append(self.record(obs, "evaluate", None, None))
        warning = None if stop else self.budget.warning()
        if warning:
            self.add("user", self.prompts.render("budget_warning", mode=mode, **warning))
            self.notify("warning", **warning)
        record["budget"] = self.budget.snapshot()
        self.trajectory.add_step(record)  # written to disk after every step
        if stop:
            raise Submitted(stop[1], reason=stop[0])

    # -- tools -------------------------------------------------------------------------
    def call_tool(self, name: str, arguments_json: str) -> Observation:
        try:
            try:
                arguments = bounded_json.loads((arguments_json or "{}").encode("utf-8", "replace"))
            except bounded_json.Refused as exc:  # bounded: 200,000 nested arrays were a RecursionError
                raise FormatError(f"the arguments of `{name}` are not valid JSON ({exc}); "
                                  "send a JSON object such as {\"code\": \"...\"}",
                                  kind="bad_arguments") from None
            if not isinstance(arguments, dict):
                raise FormatError(f"the arguments of `{name}` must be a JSON object",
                                  kind="bad_arguments")
            obs = self.tools.run(name, arguments)
        except FormatError as exc:
            obs = Observation(text=self.format_error(exc), verdict=exc.kind)
        return obs

    def history_message(self, reply: ModelReply) -> dict:
        """The assistant turn as sent back to the model: tool-call arguments that are not
        valid JSON are replaced by {} (some providers refuse them); the trajectory's step
        record keeps the original."""
        message = reply.to_message()
        for call in message.get("tool_calls", []):
            try:
                bounded_json.loads((call["function"]["arguments"] or "{}").encode("utf-8", "replace"))
            except bounded_json.Refused:
                call["function"]["arguments"] = "{}"
        return message

    def count(self, name: str, obs: Observation) -> None:
        self.tool_seconds[name] += obs.seconds
        self.tool_calls[name] += 1
        self.notify("tool", tool=name, obs=obs, best=self.best(), turn=self.budget.turns)

    def best(self) -> Observation | None:
        return self.ranked()[0][0] if self.candidates else None

    def format_error(self, exc: FormatError) -> str:
        return self.prompts.render("format_error", kind=exc.kind, message=str(exc),
                                   mode=self.config.mode)

    def cut(self, text: str) -> str:
        return truncate(text, self.config.max_output_chars, self.config.max_output_lines)

    def record(self, obs: Observation, tool: str, arguments: str | None, call_id: str | None) -> dict:
        return {"tool": tool, "call_id": call_id, "arguments_json": arguments,
                "verdict": obs.verdict, "passed": obs.passed, "speedups": obs.speedups,
                "seconds": round(obs.seconds, 3), "candidate_sha": sha(obs.code) if obs.code else None,
                "text": obs.text, "harness": obs.data}

    # -- judging candidates ------------------------------------------------------------
    def judge(self, obs: Observation, turn: int) -> tuple[str, str] | None:
        """Keep track of correct candidates; return (reason, detail) if the run should stop."""
        if obs.code:
            self.judged += 1
        if obs.passed and obs.code:
            key = sha(obs.code)
            old = self.candidates.get(key)
            if old is None or (obs.timed, obs.full) >= (old[0].timed, old[0].full):
                self.candidates[key] = (obs, turn)
        if not obs.passed:
            return None
        met, label = check_target(obs, self.config.target_speedup)
        if met:
            return "target_met", f"correct candidate meets the target ({label})"
        if obs.submitted:
            turns_left = self.budget.max_turns - self.budget.turns if self.budget.max_turns else 1
            if self.short_submits or turns_left <= 0:
                return "submitted", f"correct candidate submitted ({label})"
            self.short_submits += 1
            obs.text += "\n\n" + self.prompts.render("submit_short", label=label)
        return None

    def ranked(self) -> list[tuple[Observation, int]]:
        """Correct candidates, best first: measured speedup, then submitted, then latest."""
        def key(item: tuple[Observation, int]) -> tuple:
            obs, turn = item
            # Ranked as the target is judged: the interval's low end (the point without one).
            _base, point, interval = decision_speed(obs) if obs.measurable else (None, None, None)
            low = interval[0] if interval else (point or 0.0)
            return (obs.measurable, low, point or 0.0, obs.submitted, turn)
        return sorted(self.candidates.values(), key=key, reverse=True)

    def finish(self, stop_reason: str, stop_detail: str, judged: int | None = None) -> RunResult:
        """Re-verify the best candidates with the full trial count; the first that passes wins.
        A run the model stopped (`model_error`: not reached, no answer in time, retries spent) before
        any kernel it wrote was judged is `model_unavailable` (exit 5): a verdict about the model
        server, not about a candidate. `judged` (a search's count) replaces the loop's own."""
        judged = self.judged if judged is None else judged
        if stop_reason == "model_error" and not judged and not self.candidates:
            result = RunResult(outcome="model_unavailable", exit_code=EXIT_MODEL_UNAVAILABLE,
                               stop_reason=stop_reason, stop_detail=stop_detail, best=None,
                               target_check="no kernel judged: the model did not answer",
                               tool_seconds=dict(self.tool_seconds), tool_calls=dict(self.tool_calls))
            self.trajectory.data["final_verification"] = []
            self.notify("end", result=result)
            return result
        best, attempts = None, []
        for obs, _turn in self.ranked()[: self.config.verify_candidates]:
            # The kernel a run ends with is shown to a person: on a GPU, Nsight Compute audits it
            # unless a session already judged this evaluation (issue 55).
            audit = unaudited_gpu_result(obs)
            if not (obs.full and obs.timed) or audit:
                self.notify("verify", code_sha=sha(obs.code or ""))
                obs = self.tools.verify(obs.code or "", audit=audit)
                self.tool_seconds["verify"] += obs.seconds
                self.tool_calls["verify"] += 1
            attempts.append(self.record(obs, "verify", None, None))
            if obs.passed:
                best = obs
                break
        met, label = check_target(best, self.config.target_speedup) if best else (False, "no correct kernel")
        outcome, code = (("success", 0) if met else ("short_of_target", 3)) if best else ("no_correct_kernel", 1)
        self.trajectory.data["final_verification"] = attempts
        result = RunResult(outcome=outcome, exit_code=code, stop_reason=stop_reason,
                           stop_detail=stop_detail, best=best, target_check=label,
                           tool_seconds=dict(self.tool_seconds), tool_calls=dict(self.tool_calls))
        self.notify("end", result=result)
        return result
