"""The composite, verifiable reward for one harness verdict.

    r = α·1[compiled] + β·1[correct] + γ·min(t_base / t, r_max)·1[correct]

with the defaults α = 0.5 (compile_weight), β = 1.0 (correct_weight), γ = 1.0
(speed_weight), r_max = 3.0, and t_base the TorchInductor time (baseline="compile"; or
eager PyTorch with baseline="eager"). So a kernel that does not compile scores 0, one that
compiles but is wrong 0.5, a correct one 1.5 + its capped speedup (at most 4.5).

Decisions (documented in docs/guides/training.md, "The reward"):
- The speed term uses the POINT estimate of the speedup (`EvalResult.speedups`), not the low
  end of its 95% interval (`speedup_intervals`) that optimize's target, bench's fast_p and
  verify's gate decide on. A reward is averaged over many samples, where timing noise averages
  out; the lower bound would pay less for fewer timing samples (a wider interval), a bias
  against large problems, not a property of the kernel.
- "correct" means `EvalResult.passed`: every trial passed AND no flag of severity
  "review" or "reject". A result the hack defences flag for review scores as incorrect but
  keeps its compile credit (it compiled and ran honestly enough to be looked at).
- A result the defences REJECT (status "rejected", or any flag of severity "reject":
  mutated inputs, aliased or non-tensor outputs, banned code) scores 0 in total: the compile
  credit is withheld too, so that cheating never pays more than an honest wrong kernel.
- Speed counts only when the timings are meaningful: on the CPU (Triton interpreter) the
  speed term is 0 and a note says why. Without the chosen baseline's timing (e.g. no
  TorchInductor baseline) the other baseline is used and a note says so; with neither, the
  speed term is 0.
- Infrastructure failures (status "harness_error", "bad_problem") are not the candidate's
  fault: `infra_error` is set and trainers get `None` for them, never a number.

The optional judge term λ·J(code) (kernelagent.rl.judge) is reported separately in
`judge` / `judge_term` and added to `reward` only when `mix_judge=True`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

BASELINES = ("compile", "eager")
INFRA_STATUSES = ("harness_error", "bad_problem", "too_large")  # too_large: the machine, not the kernel


@dataclass
class RewardConfig:
    compile_weight: float = 0.5  # α
    correct_weight: float = 1.0  # β
    speed_weight: float = 1.0  # γ
    r_max: float = 3.0  # cap on t_base / t
    baseline: str = "compile"  # "compile" (TorchInductor) or "eager"
    judge_weight: float = 0.0  # λ; the judge runs only when a Judge is given
    mix_judge: bool = False  # add λ·J to `reward` (never by default)

    def __post_init__(self) -> None:
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        if self.r_max <= 0:
            raise ValueError("r_max must be positive")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "RewardConfig":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in (data or {}).items() if k in known})


@dataclass
class RewardBreakdown:
    reward: float  # what a trainer optimises: the verifiable part (+ λ·J only when mixed)
    verifiable: float  # α·compiled + β·correct + γ·speed, never touched by the judge
    status: str  # the harness status, or "no_code" / "infra_error"
    compiled: bool = False  # counted as compiled (False for rejected hacks)
    correct: bool = False  # EvalResult.passed
    rejected: bool = False  # the hack defences rejected it
    flagged: bool = False  # flagged for review (counted as incorrect)
    speedup: float | None = None  # t_base / t, uncapped; None when not meaningful
    baseline: str | None = None  # the baseline actually used for the speed term
    compile_term: float = 0.0
    correct_term: float = 0.0
    speed_term: float = 0.0
    judge: float | None = None  # J in [0, 1] when a judge ran
    judge_scores: dict[str, float] = field(default_factory=dict)
    judge_term: float = 0.0  # λ·J (reported; in `reward` only when mixed)
    infra_error: bool = False  # the harness failed, not the candidate: no reward
    notes: list[str] = field(default_factory=list)
    reason: str = ""  # the harness's one-line reason

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def value(self) -> float | None:
        """The number a trainer gets: None for infrastructure failures."""
        return None if self.infra_error else self.reward


def _is_rejected(result: EvalResult) -> bool:
    return result.status == "rejected" or any(f.severity == "reject" for f in result.flags)


def _is_flagged(result: EvalResult) -> bool:
    return any(f.severity == "review" for f in result.flags)


def reward_from_result(result: EvalResult | dict[str, Any], cfg: RewardConfig | None = None, *,
                       judge: Any = None) -> RewardBreakdown:
    """The reward of one `EvalResult` (or its dict). `judge`: a JudgeScore, or None."""
    from kernelagent.harness import EvalResult

    cfg = cfg or RewardConfig()
    if isinstance(result, dict):
        result = EvalResult.from_dict(result)
    notes: list[str] = []
    if result.status in INFRA_STATUSES:
        out = RewardBreakdown(reward=0.0, verifiable=0.0, status=result.status, infra_error=True,
                              reason=result.reason,
                              notes=["infrastructure failure: no reward (None for trainers)"])
        return _with_judge(out, cfg, judge)
    rejected = _is_rejected(result)
    flagged = _is_flagged(result)
    compiled = bool(result.compiled) and not rejected
    correct = bool(result.passed)
    if rejected:
        notes.append("rejected by the hack defences: no compile credit, scored as incorrect")
    elif flagged:
        notes.append("flagged for review: scored as incorrect (compile credit kept)")
    speedup, used, speed_term = None, None, 0.0
    if correct:
        candidate = result.timings.get("candidate")
        if candidate is None:
            notes.append("not timed: speed term 0")
        elif not all(t.meaningful for t in result.timings.values()):
            notes.append("timings not meaningful (CPU / Triton interpreter): speed term 0")
        else:
            order = [cfg.baseline] + [b for b in BASELINES if b != cfg.baseline]
            for name in order:
                if result.speedups.get(name):
                    used, speedup = name, float(result.speedups[name])
                    break
            if used is None:
                notes.append("no baseline timing: speed term 0")
            else:
                if used != cfg.baseline:
                    notes.append(f"no {cfg.baseline} baseline: speed measured against {used}")
                speed_term = cfg.speed_weight * min(speedup, cfg.r_max)
    compile_term = cfg.compile_weight * float(compiled)
    correct_term = cfg.correct_weight * float(correct)
    verifiable = compile_term + correct_term + speed_term
    out = RewardBreakdown(reward=verifiable, verifiable=verifiable, status=result.status,
                          compiled=compiled, correct=correct, rejected=rejected, flagged=flagged,
                          speedup=speedup, baseline=used, compile_term=compile_term,
                          correct_term=correct_term, speed_term=speed_term, notes=notes,
                          reason=result.reason)
    return _with_judge(out, cfg, judge)


def no_code_breakdown(message: str) -> RewardBreakdown:
    """A completion with no candidate in it: a bad answer (0), not an infrastructure failure."""
    return RewardBreakdown(reward=0.0, verifiable=0.0, status="no_code", reason=message,
                           notes=["no candidate code found in the completion"])


def infra_breakdown(message: str) -> RewardBreakdown:
    return RewardBreakdown(reward=0.0, verifiable=0.0, status="infra_error", infra_error=True,
                           reason=message, notes=["infrastructure failure: no reward (None for trainers)"])


def _with_judge(out: RewardBreakdown, cfg: RewardConfig, judge: Any) -> RewardBreakdown:
    if judge is None:
        return out
    out.judge = judge.score
    out.judge_scores = dict(judge.scores)
    if judge.error:
        out.notes.append(f"judge: {judge.error}")
    if judge.score is not None:
        out.judge_term = cfg.judge_weight * judge.score
        if cfg.mix_judge and not out.infra_error:
            out.reward = out.verifiable + out.judge_term
    return out
