"""Fine-tuning rows from agent runs (`kernelagent optimize` run folders).

One row per kept kernel, in chat format:

    {"messages": [{"role": "system", ...}, {"role": "user", ...},          # as recorded
                  {"role": "assistant", "content": "<reasoning>\n\n```python\n<kernel>```"}],
     "problem_id", "problem_sha256", "kernel_sha256", "speedup", "speedup_baseline",
     "timings_meaningful", "reasoning_chars", "run_dir", "model"}

- Kept: runs whose summary names a best kernel that passed the final verification
  (verdict "correct", kernel.py present and matching the recorded hash), and whose speedup
  (vs TorchInductor, else eager) is at least `min_speedup`. Runs whose timings mean nothing
  (CPU) have no speedup: they pass only when `min_speedup <= 0` or `include_unmeasured`.
- The reasoning is the assistant's prose over the run (every assistant message's text, code
  blocks cut out), in order. The row's answer is that reasoning, then the final kernel.
- Deduplicated by kernel hash within a problem (the shortest reasoning wins); then, per problem, the
  `per_problem` rows with the most concise reasoning are kept (ties: faster, then hash).

Statistics go to `<out stem>.stats.json` beside the rows.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from pathlib import Path
from typing import Any

FENCE = re.compile(r"```[^\n]*\n.*?```", re.DOTALL)


def reasoning_of(messages: list[dict]) -> str:
    parts = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        text = FENCE.sub("", str(message.get("content") or "")).strip()
        text = re.sub(r"\n{3,}", "\n\n", text)
        if text:
            parts.append(text)
    return "\n\n".join(parts)


def _speedup(best: dict) -> tuple[float | None, str | None]:
    if not best.get("timings_meaningful"):
        return None, None
    if best.get("speedup_vs_inductor") is not None:
        return float(best["speedup_vs_inductor"]), "compile"
    if best.get("speedup_vs_eager") is not None:
        return float(best["speedup_vs_eager"]), "eager"
    return None, None


def find_run_dirs(paths: list[str | Path]) -> list[Path]:
    """Run folders (holding trajectory.json and summary.json) at or under each path."""
    out: list[Path] = []
    for path in map(Path, paths):
        if (path / "trajectory.json").is_file():
            out.append(path)
        elif path.is_dir():
            out.extend(sorted(p.parent for p in path.rglob("trajectory.json")
                              if (p.parent / "summary.json").is_file()))
    seen, unique = set(), []
    for p in out:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            unique.append(p)
    return unique


def row_from_run(run_dir: Path, min_speedup: float,
                 include_unmeasured: bool = False) -> tuple[dict | None, str]:
    """(row, "") or (None, why it was skipped)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        trajectory = json.loads((run_dir / "trajectory.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None, "unreadable"
    best = summary.get("best")
    if not best or best.get("verdict") != "correct":
        return None, "no_verified_kernel"
    verified = trajectory.get("final_verification") or []
    if not any(v.get("passed") for v in verified):
        return None, "no_verified_kernel"
    kernel_path = run_dir / "kernel.py"
    if not kernel_path.is_file():
        return None, "no_kernel_file"
    kernel = kernel_path.read_text(encoding="utf-8")
    kernel_sha = hashlib.sha256(kernel.encode()).hexdigest()
    if best.get("candidate_sha256") and best["candidate_sha256"] != kernel_sha:
        return None, "kernel_hash_mismatch"
    speedup, baseline = _speedup(best)
    if speedup is None:
        if min_speedup > 0 and not include_unmeasured:
            return None, "unmeasured"
    elif speedup < min_speedup:
        return None, "below_min_speedup"
    messages = trajectory.get("messages") or []
    if len(messages) < 2 or messages[0].get("role") != "system" or messages[1].get("role") != "user":
        return None, "no_prompts"
    reasoning = reasoning_of(messages[2:])
    answer = (reasoning + "\n\n" if reasoning else "") + f"```python\n{kernel.rstrip()}\n```"
    problem = summary.get("problem") or trajectory.get("problem") or {}
    row = {
        "messages": [{"role": "system", "content": messages[0]["content"]},
                     {"role": "user", "content": messages[1]["content"]},
                     {"role": "assistant", "content": answer}],
        "problem_id": problem.get("name"),
        "problem_sha256": problem.get("sha256"),
        "kernel_sha256": kernel_sha,
        "speedup": speedup,
        "speedup_baseline": baseline,
        "timings_meaningful": bool(best.get("timings_meaningful")),
        "reasoning_chars": len(reasoning),
        "mode": (trajectory.get("config") or {}).get("mode"),
        "model": summary.get("model"),
        "run_dir": str(run_dir),
    }
    return row, ""


def select_rows(rows: list[dict], per_problem: int = 1) -> list[dict]:
    def key(row: dict) -> tuple:
        return (row["reasoning_chars"], -(row["speedup"] or 0.0), row["kernel_sha256"])

    by_kernel: dict[tuple, dict] = {}
    for row in rows:  # the same kernel for two different problems is two examples
        k = (row["problem_sha256"] or row["problem_id"], row["kernel_sha256"])
        if k not in by_kernel or key(row) < key(by_kernel[k]):
            by_kernel[k] = row
    by_problem: dict[str, list[dict]] = {}
    for row in by_kernel.values():
        by_problem.setdefault(row["problem_sha256"] or row["problem_id"], []).append(row)
    kept = []
    for group in by_problem.values():
        kept.extend(sorted(group, key=key)[:per_problem])
    return sorted(kept, key=lambda r: (str(r["problem_id"]), key(r)))


def stats_of(rows: list[dict], skipped: dict[str, int], runs: int, min_speedup: float) -> dict:
    speedups = sorted(r["speedup"] for r in rows if r["speedup"] is not None)
    lengths = [r["reasoning_chars"] for r in rows]
    dist: dict[str, Any] = {"measured": len(speedups), "unmeasured": len(rows) - len(speedups)}
    if speedups:
        def q(p: float) -> float:
            return speedups[min(len(speedups) - 1, int(p * (len(speedups) - 1) + 0.5))]

        dist.update(min=speedups[0], p25=q(0.25), median=statistics.median(speedups), p75=q(0.75),
                    max=speedups[-1], mean=statistics.fmean(speedups),
                    histogram={label: sum(lo <= s < hi for s in speedups) for label, lo, hi in (
                        ("<1x", 0.0, 1.0), ("1-1.5x", 1.0, 1.5), ("1.5-2x", 1.5, 2.0),
                        ("2-3x", 2.0, 3.0), (">=3x", 3.0, float("inf")))})
    return {"rows": len(rows), "problems": len({r["problem_sha256"] or r["problem_id"] for r in rows}),
            "runs_read": runs, "skipped": skipped, "min_speedup": min_speedup,
            "mean_reasoning_chars": statistics.fmean(lengths) if lengths else 0.0,
            "median_reasoning_chars": statistics.median(lengths) if lengths else 0.0,
            "speedup": dist}


def stats_path_for(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(f"{out.stem}.stats.json")


def export_sft(run_dirs: list[str | Path], min_speedup: float = 1.0,
               out: str | Path = "sft.jsonl", *, per_problem: int = 1,
               include_unmeasured: bool = False) -> dict[str, Any]:
    """Write the rows to `out` and the statistics beside it; return the statistics."""
    runs = find_run_dirs(run_dirs)
    candidates, skipped = [], {}
    for run in runs:
        row, why = row_from_run(run, min_speedup, include_unmeasured)
        if row is None:
            skipped[why] = skipped.get(why, 0) + 1
        else:
            candidates.append(row)
    rows = select_rows(candidates, per_problem)
    dropped = len(candidates) - len(rows)
    if dropped:
        skipped["duplicate_or_less_concise"] = dropped
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    stats = stats_of(rows, skipped, len(runs), min_speedup)
    stats["out"] = str(out)
    stats_path_for(out).write_text(json.dumps(stats, indent=1) + "\n", encoding="utf-8")
    return stats
