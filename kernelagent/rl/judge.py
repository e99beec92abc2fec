"""An optional LLM judge: J(code) in [0, 1] from any litellm model.

The judge reads the reference and the candidate and answers with JSON scores in [0, 1] for
correctness, compilability and speed; J is their weighted mean. It densifies a sparse reward
early in training; it is never ground truth. It is off by default, reported separately
(`RewardBreakdown.judge`, `.judge_term`) and added to the reward only with
`RewardConfig(mix_judge=True)`. A judge that fails (network, bad JSON) gives `score=None`
and a note; the verifiable reward is unaffected.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

CRITERIA = ("correctness", "compilability", "speed")

JUDGE_PROMPT = """You review GPU kernels. Below is a PyTorch reference module (`Model`) and a \
candidate replacement (`ModelNew`) written with Triton kernels.

Estimate, each as a number between 0 and 1:
- "correctness": how likely the candidate computes the same outputs as the reference for all inputs;
- "compilability": how likely it imports, compiles and runs without error;
- "speed": how likely it is faster than torch.compile on a modern GPU.

Answer with one JSON object and nothing else, e.g.
{{"correctness": 0.7, "compilability": 0.9, "speed": 0.4}}

## Reference
```python
{reference}
```

## Candidate
```python
{candidate}
```"""


@dataclass
class JudgeScore:
    score: float | None  # J, the weighted mean of the criteria; None when the judge failed
    scores: dict[str, float] = field(default_factory=dict)
    error: str = ""


def parse_scores(text: str, weights: dict[str, float] | None = None) -> JudgeScore:
    """Pull the JSON object out of a reply and score it. Values outside [0, 1] are clamped;
    a 0-10 scale (any value > 1) is rescaled."""
    weights = weights or {c: 1.0 for c in CRITERIA}
    match = re.search(r"\{.*\}", text or "", re.DOTALL)
    if not match:
        return JudgeScore(None, error="no JSON object in the judge's reply")
    try:
        data = json.loads(match.group(0))
    except json.JSONDecodeError as exc:
        return JudgeScore(None, error=f"bad JSON from the judge: {exc}")
    try:
        raw = {c: float(data[c]) for c in CRITERIA if c in data}
    except (TypeError, ValueError):
        return JudgeScore(None, error="non-numeric judge scores")
    if not raw:
        return JudgeScore(None, error=f"the judge gave none of {', '.join(CRITERIA)}")
    if any(v > 1.0 for v in raw.values()):
        raw = {c: v / 10.0 for c, v in raw.items()}
    scores = {c: min(1.0, max(0.0, v)) for c, v in raw.items()}
    total = sum(weights.get(c, 0.0) for c in scores)
    if total <= 0:
        return JudgeScore(None, scores, error="judge weights sum to 0")
    return JudgeScore(sum(weights.get(c, 0.0) * v for c, v in scores.items()) / total, scores)


class Judge:
    """`Judge("openai/gpt-4o-mini").score(reference_source, candidate_source) -> JudgeScore`.

    Any litellm model string; `api_base`/`api_key` for OpenAI-compatible servers."""

    def __init__(self, model: str, *, api_base: str | None = None, api_key: str | None = None,
                 timeout: float = 60.0, weights: dict[str, float] | None = None,
                 temperature: float = 0.0, max_workers: int = 8) -> None:
        self.model, self.api_base, self.api_key = model, api_base, api_key
        self.timeout, self.temperature = timeout, temperature
        self.weights = weights or {c: 1.0 for c in CRITERIA}
        self.max_workers = max_workers

    def score(self, reference: str, candidate: str) -> JudgeScore:
        import litellm

        prompt = JUDGE_PROMPT.format(reference=reference.strip(), candidate=candidate.strip())
        kwargs: dict[str, Any] = {"model": self.model, "timeout": self.timeout,
                                  "messages": [{"role": "user", "content": prompt}],
                                  "temperature": self.temperature, "num_retries": 1}
        if self.api_base:
            kwargs["api_base"] = self.api_base
        if self.api_key:
            kwargs["api_key"] = self.api_key
        try:
            response = litellm.completion(**kwargs)
            text = response.choices[0].message.content or ""
        except Exception as exc:  # the judge is advisory: a failure is a note, not a crash
            return JudgeScore(None, error=f"{type(exc).__name__}: {str(exc)[:200]}")
        return parse_scores(text, self.weights)

    def score_many(self, pairs: list[tuple[str, str]]) -> list[JudgeScore]:
        if not pairs:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(pairs))) as pool:
            return list(pool.map(lambda p: self.score(*p), pairs))
