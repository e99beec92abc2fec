"""Fine-tuning rows from agent runs (`kernelagent optimize` run folders).

One row per kept run, in the chat form TRL's SFTTrainer takes:

    {"messages": [...the conversation as the model saw it...],
     "tools": "<JSON list of the tool schemas>",          # tools-mode runs; "" otherwise
     "problem_id": "level1/1_relu", "split": "train", "problem_sha256", "kernel_sha256",
     "speedup", "speedup_baseline", "timings_meaningful", "reasoning_chars", "turns",
     "mode", "model", "run_dir"}

- Tools-mode runs are exported as they happened: assistant messages with `tool_calls`
  (`{"type": "function", "function": {"name", "arguments": {...}}}`), `tool` messages with
  the harness's answers, under the tools-mode system prompt, and the `tools` column (a JSON
  string, which SFTTrainer decodes, so rows with different tools stay one Arrow schema).
  Text-mode runs keep their own text-mode prompt and turns (code blocks, feedback).
  The conversation ends with the turn that produced the verified kernel and its result.
- The id and split are bench's (kernelagent.bench.discover): the split is a hash of the
  problem's content with `split`/`seed`, as `dataset prompts` writes them, and rows of test
  problems are left out unless `include_test`.
- Kept: the best kernel passed the final verification (kernel.py present, matching the
  recorded hash) and its speedup (vs TorchInductor, else eager) is at least `min_speedup`
  (runs without meaningful timings pass only at `min_speedup <= 0` or `include_unmeasured`).
- Curation (ConCuR-style, all optional): `max_turns` (assistant turns), `max_reasoning_chars`,
  `reasoning_percentile` (per problem, keep rows at or under that percentile of the
  problem's reasoning lengths), deduplication by kernel hash per problem (the most concise
  wins), then the `per_problem` most concise rows per problem (ties: faster, then hash).

Statistics (kept, and dropped per reason) go to `<out stem>.stats.json` beside the rows.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from pathlib import Path
from typing import Any

from kernelagent.bench.discover import DEFAULT_SEED, DEFAULT_SPLIT, problem_key, problem_split
from kernelagent.harness import bounded_json

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


def _tool_call(call: dict) -> dict:
    fn = call.get("function") or call
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = bounded_json.loads((args or "{}").encode("utf-8", "replace"))
        except bounded_json.Refused:
            args = {}
    return {"type": "function", "function": {"name": fn.get("name", ""),
                                             "arguments": args if isinstance(args, dict) else {}}}


def conversation(messages: list[dict], kernel: str) -> list[dict]:
    """The recorded conversation in SFTTrainer's form, ending with the turn that produced
    `kernel` (the last assistant turn holding it) and the answers to that turn."""
    names: dict[str, str] = {}
    out: list[dict] = []
    for m in messages:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            calls = [_tool_call(c) for c in m["tool_calls"]]
            for raw, call in zip(m["tool_calls"], calls):
                names[str(raw.get("id"))] = call["function"]["name"]
            out.append({"role": "assistant", "content": str(m.get("content") or ""), "tool_calls": calls})
        elif role == "tool":
            out.append({"role": "tool", "name": names.get(str(m.get("tool_call_id")), ""),
                        "content": str(m.get("content") or "")})
        elif role in ("system", "user", "assistant"):
            out.append({"role": role, "content": str(m.get("content") or "")})
    key = kernel.strip()
    last, current = None, ""
    for i, m in enumerate(out):
        if m["role"] != "assistant":
            continue
        if key and key in m["content"]:
            last = i
        for call in m.get("tool_calls", []):
            current = str(call["function"]["arguments"].get("code") or current)  # no code: the latest
            if key and current.strip() == key:
                last = i
    if last is None:
        return out
    end = last + 1
    while end < len(out) and out[end]["role"] != "assistant":
        end += 1
    return out[:end]


def row_from_run(run_dir: Path, min_speedup: float, include_unmeasured: bool = False, *,
                 split: float = DEFAULT_SPLIT, seed: int = DEFAULT_SEED) -> tuple[dict | None, str]:
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
    config = trajectory.get("config") or {}
    mode = config.get("mode")
    node = _search_node(trajectory, kernel)
    chat = tree_conversation(node) if node is not None else conversation(messages, kernel)
    uses_tools = any(m.get("tool_calls") for m in chat)
    tools = ""
    if uses_tools:
        from kernelagent.agent.tools import tool_schemas

        tools = json.dumps(tool_schemas(config.get("backend") or "triton"))
    problem = summary.get("problem") or trajectory.get("problem") or {}
    sha = problem.get("sha256")
    pid = problem_key(problem["path"]) if problem.get("path") else problem.get("name")
    reasoning = reasoning_of(chat[2:])
    row = {
        "messages": chat,
        "tools": tools,
        "problem_id": pid,
        "split": problem_split(sha, split, seed) if sha else None,
        "problem_sha256": sha,
        "kernel_sha256": kernel_sha,
        "speedup": speedup,
        "speedup_baseline": baseline,
        "timings_meaningful": bool(best.get("timings_meaningful")),
        "reasoning_chars": len(reasoning),
        "turns": sum(m["role"] == "assistant" for m in chat),
        "mode": "tools" if uses_tools else (mode if mode != "auto" else "text"),
        "model": summary.get("model"),
        "run_dir": str(run_dir),
    }
    if node is not None:  # a search run (kernelagent/search): the winner's node and its ancestry
        row.update(search_node=node.id, search_path=[n.id for n in _tree(trajectory).path(node.id)],
                   verified="final")
    return row, ""


def _tree(trajectory: dict) -> Any:
    from kernelagent.search.tree import Tree

    return Tree.from_dict(trajectory["search"])


def tree_conversation(node: Any) -> list[dict]:
    from kernelagent.search.tree import conversation as node_conversation

    return [{"role": m.get("role"), "content": str(m.get("content") or "")} for m in node_conversation(node)]


def _search_node(trajectory: dict, kernel: str) -> Any:
    """The search node whose reply produced `kernel` (the first that did), or None for a single run."""
    if not isinstance(trajectory.get("search"), dict):
        return None
    key = kernel.strip()
    nodes = [n for n in _tree(trajectory).nodes if n.code and n.code.strip() == key and n.reply is not None]
    return min(nodes, key=lambda n: (n.duplicate_of is not None, n.id)) if nodes else None


def winner_rows(run_dir: Path, min_speedup: float, include_unmeasured: bool = False, *,
                split: float = DEFAULT_SPLIT, seed: int = DEFAULT_SEED) -> list[dict]:
    """`--all-winners`: a row for every correct node of a search run at least `min_speedup`
    fast (each was evaluated with the full trial count; only the final winner was re-verified,
    which `verified` says: "final" or "search")."""
    try:
        trajectory = json.loads((run_dir / "trajectory.json").read_text(encoding="utf-8"))
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return []
    if not isinstance(trajectory.get("search"), dict):
        return []
    tree = _tree(trajectory)
    problem = summary.get("problem") or trajectory.get("problem") or {}
    sha = problem.get("sha256")
    pid = problem_key(problem["path"]) if problem.get("path") else problem.get("name")
    final = ((summary.get("best") or {}).get("candidate_sha256"))
    rows = []
    for node in tree.correct():
        if not node.code or node.reply is None:
            continue
        speed = node.speedups.get("compile", node.speedups.get("eager")) if node.measurable else None
        if speed is None and min_speedup > 0 and not include_unmeasured:
            continue
        if speed is not None and speed < min_speedup:
            continue
        chat = tree_conversation(node)
        kernel_sha = hashlib.sha256(node.code.encode()).hexdigest()
        rows.append({"messages": chat, "tools": "", "problem_id": pid,
                     "split": problem_split(sha, split, seed) if sha else None, "problem_sha256": sha,
                     "kernel_sha256": kernel_sha, "speedup": speed,
                     "speedup_baseline": ("compile" if "compile" in node.speedups else "eager") if speed else None,
                     "timings_meaningful": bool(node.measurable), "reasoning_chars": len(reasoning_of(chat[2:])),
                     "turns": sum(m["role"] == "assistant" for m in chat), "mode": "text",
                     "model": summary.get("model"), "run_dir": str(run_dir), "search_node": node.id,
                     "search_path": [n.id for n in tree.path(node.id)],
                     "verified": "final" if kernel_sha == final else "search"})
    return rows


def curate(rows: list[dict], *, max_turns: int | None = None, max_reasoning_chars: int | None = None,
           reasoning_percentile: float | None = None) -> tuple[list[dict], dict[str, int]]:
    """Length and turn filters; returns (kept, {reason: dropped})."""
    dropped: dict[str, int] = {}

    def drop(reason: str) -> None:
        dropped[reason] = dropped.get(reason, 0) + 1

    kept = []
    for row in rows:
        if max_turns is not None and row["turns"] > max_turns:
            drop("over_max_turns")
        elif max_reasoning_chars is not None and row["reasoning_chars"] > max_reasoning_chars:
            drop("over_max_reasoning_chars")
        else:
            kept.append(row)
    if reasoning_percentile is not None:
        groups: dict[str, list[dict]] = {}
        for row in kept:
            groups.setdefault(row["problem_sha256"] or row["problem_id"], []).append(row)
        kept = []
        for group in groups.values():
            lengths = sorted(r["reasoning_chars"] for r in group)
            cut = lengths[min(len(lengths) - 1, int(reasoning_percentile / 100 * (len(lengths) - 1) + 0.5))]
            for row in group:
                if row["reasoning_chars"] <= cut:
                    kept.append(row)
                else:
                    drop("over_reasoning_percentile")
    return kept, dropped


def select_rows(rows: list[dict], per_problem: int = 1,
                dropped: dict[str, int] | None = None) -> list[dict]:
    def key(row: dict) -> tuple:
        return (row["reasoning_chars"], -(row["speedup"] or 0.0), row["kernel_sha256"])

    by_kernel: dict[tuple, dict] = {}
    for row in rows:  # the same kernel for two different problems is two examples
        k = (row["problem_sha256"] or row["problem_id"], row["kernel_sha256"])
        if k not in by_kernel or key(row) < key(by_kernel[k]):
            by_kernel[k] = row
    if dropped is not None and len(rows) > len(by_kernel):
        dropped["duplicate_kernel"] = dropped.get("duplicate_kernel", 0) + len(rows) - len(by_kernel)
    by_problem: dict[str, list[dict]] = {}
    for row in by_kernel.values():
        by_problem.setdefault(row["problem_sha256"] or row["problem_id"], []).append(row)
    kept = []
    for group in by_problem.values():
        kept.extend(sorted(group, key=key)[:per_problem])
        if dropped is not None and len(group) > per_problem:
            dropped["over_per_problem"] = dropped.get("over_per_problem", 0) + len(group) - per_problem
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
               include_unmeasured: bool = False, split: float = DEFAULT_SPLIT,
               seed: int = DEFAULT_SEED, include_test: bool = False,
               max_turns: int | None = None, max_reasoning_chars: int | None = None,
               reasoning_percentile: float | None = None, all_winners: bool = False) -> dict[str, Any]:
    """Write the rows to `out` and the statistics beside it; return the statistics. Both files
    are checked first and written whole under a temporary name; with no row at all nothing is
    written (an earlier export stays as it was) and the statistics say why (`written` False).
    `all_winners`: from a search run, every correct node at least `min_speedup` fast, not only
    the path to the final winner (single runs give their one row either way)."""
    from kernelagent.files import check_output_file, write_files

    out = check_output_file(out)
    check_output_file(stats_path_for(out))
    runs = find_run_dirs(run_dirs)
    candidates, skipped = [], {}
    for run in runs:
        row, why = row_from_run(run, min_speedup, include_unmeasured, split=split, seed=seed)
        found = [row] if row is not None else []
        if all_winners:
            more = winner_rows(run, min_speedup, include_unmeasured, split=split, seed=seed)
            known = {r["kernel_sha256"] for r in found}
            found += [r for r in more if r["kernel_sha256"] not in known]
        if not found:
            skipped[why] = skipped.get(why, 0) + 1
        for row in found:
            if row["split"] == "test" and not include_test:
                skipped["test_split"] = skipped.get("test_split", 0) + 1
            else:
                candidates.append(row)
    curated, dropped = curate(candidates, max_turns=max_turns, max_reasoning_chars=max_reasoning_chars,
                              reasoning_percentile=reasoning_percentile)
    for reason, n in dropped.items():
        skipped[reason] = skipped.get(reason, 0) + n
    rows = select_rows(curated, per_problem, skipped)
    stats = stats_of(rows, skipped, len(runs), min_speedup)
    stats.update(out=str(out), split=split, seed=seed, include_test=include_test,
                 kept_by_mode={m: sum(r["mode"] == m for r in rows) for m in sorted({r["mode"] for r in rows})},
                 curation={"max_turns": max_turns, "max_reasoning_chars": max_reasoning_chars,
                           "reasoning_percentile": reasoning_percentile, "per_problem": per_problem,
                           "all_winners": all_winners}, written=bool(rows))
    if rows:
        write_files({out: "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows),
                     stats_path_for(out): json.dumps(stats, indent=1) + "\n"})
    return stats
