"""Prompt datasets: one row per problem, with a split that never leaks a problem.

A row is TRL's conversational prompt-only format plus the columns the reward function reads:

    {"prompt": [{"role": "system", ...}, {"role": "user", ...}],   # what optimize sends
     "problem_id": "level1/1_relu", "problem_source": "...", "problem_path": "...",
     "problem_sha256": "...", "split": "train" | "test"}

The split is decided per problem, by a hash of (seed, problem id): a problem is in train
when that hash, as a number in [0, 1), is below `split`. So the same seed always gives the
same split, and adding or removing problems never moves another problem across it.
Problems whose sources are identical (the same file under two names) are one group and go
together, to the side of the first of them, so no copy of a test problem reaches train.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

DEFAULT_GPU = "NVIDIA H100 80GB HBM3"


def find_problems(root: str | Path) -> list[Path]:
    """Problem files under `root` (recursively), skipping solutions and private files."""
    from kernelagent.problem import ProblemError, load_problem

    root = Path(root)
    if root.is_file():
        return [root]
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(p.startswith((".", "_")) or p in ("solutions", "__pycache__") for p in rel):
            continue
        try:
            load_problem(path)
        except ProblemError:
            continue  # not a problem (a helper script, a benchmark driver)
        found.append(path)
    return found


def split_fraction(problem_id: str, seed: int) -> float:
    digest = hashlib.sha256(f"{seed}:{problem_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64


def assign_splits(problems: dict[str, str], split: float, seed: int) -> dict[str, str]:
    """{problem_id: source} -> {problem_id: "train"|"test"}; identical sources go together."""
    groups: dict[str, list[str]] = {}
    for pid in sorted(problems):
        groups.setdefault(hashlib.sha256(problems[pid].encode()).hexdigest(), []).append(pid)
    out = {}
    for members in groups.values():
        side = "train" if split_fraction(members[0], seed) < split else "test"
        for pid in members:
            out[pid] = side
    return out


def device_for(gpu: str | None) -> tuple[dict[str, Any], bool]:
    """(device facts for the prompt, cpu?) for a GPU name, or "cpu"."""
    from kernelagent.hardware import describe_device

    if not gpu or gpu.lower() == "cpu":
        return describe_device({"cuda": False}), True
    return describe_device({"cuda": True, "gpu_name": gpu}), False


def build_rows(root: str | Path, *, mode: str = "text", gpu: str | None = DEFAULT_GPU,
               target_speedup: float = 1.0, max_turns: int = 1, split: float | None = None,
               seed: int = 0, inspect_inputs: bool = True, workers: int = 4) -> list[dict]:
    """One row per problem under `root`, sorted by problem id."""
    from kernelagent.agent import BACKEND, Prompts, prompt_context
    from kernelagent.agent.tools import describe_inputs
    from kernelagent.problem import load_problem
    from kernelagent.rl.problems import problem_id_for

    paths = find_problems(root)
    base = Path(root) if Path(root).is_dir() else None
    problems = [load_problem(p) for p in paths]
    ids = [problem_id_for(p, base) for p in paths]
    if len(set(ids)) != len(ids):
        raise ValueError("two problems have the same id")
    if inspect_inputs:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            inputs = list(pool.map(lambda p: describe_inputs(str(p.path)), problems))
    else:
        inputs = [{}] * len(problems)
    device, cpu = device_for(gpu)
    sides = assign_splits({pid: p.source for pid, p in zip(ids, problems)}, split, seed) \
        if split is not None else {}
    prompts = Prompts()
    rows = []
    for pid, problem, inp in sorted(zip(ids, problems, inputs), key=lambda x: x[0]):
        context = prompt_context(problem, mode=mode, backend=BACKEND, inputs=inp, device=device, cpu=cpu,
                                 target_speedup=target_speedup, max_turns=max_turns)
        row = {"prompt": [{"role": "system", "content": prompts.render("system", **context)},
                          {"role": "user", "content": prompts.render("task", **context)}],
               "problem_id": pid, "problem_source": problem.source,
               "problem_path": str(problem.path), "problem_sha256": problem.sha256}
        if sides:
            row["split"] = sides[pid]
        rows.append(row)
    return rows


def write_jsonl(rows: list[dict], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_jsonl(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_prompts(root: str | Path, out: str | Path, **kwargs: Any) -> dict[str, Any]:
    """Write `out` (every row); with a split also `<stem>.train.jsonl` / `<stem>.test.jsonl`.
    Returns {"rows", "train", "test", "files"}."""
    out = Path(out)
    rows = build_rows(root, **kwargs)
    write_jsonl(rows, out)
    files = [str(out)]
    info: dict[str, Any] = {"rows": len(rows)}
    if kwargs.get("split") is not None:
        for side in ("train", "test"):
            part = [r for r in rows if r["split"] == side]
            path = out.with_name(f"{out.stem}.{side}{out.suffix or '.jsonl'}")
            write_jsonl(part, path)
            files.append(str(path))
            info[side] = len(part)
    info["files"] = files
    return info
