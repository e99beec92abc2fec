"""Prompt datasets: one row per problem, with a split that never leaks a problem.

A row is TRL's conversational prompt-only format plus the columns the reward function reads:

    {"prompt": [{"role": "system", ...}, {"role": "user", ...}],   # what optimize sends
     "problem_id": "level1/1_relu", "problem_source": "...", "problem_path": "...",
     "problem_sha256": "...", "split": "train" | "test"}

Problems are found by bench's discovery (kernelagent.bench.discover), so ids are the same
whatever folder is given ("levelN/<stem>" in a level folder, else the stem) and files that
are not problems are skipped. The split is decided per problem by a hash of (seed, the
problem's content hash): a problem is in train when that hash, as a number in [0, 1), is
below the train fraction. The same seed always gives the same split; adding, removing,
renaming or moving problems never moves another one across it; copies of one source go
together. `export sft` uses the same rule, so its rows can leave test problems out.

The prompts are rendered from the templates `optimize` renders (prompt_context), with the
same budget and device facts: the defaults are the environment's (`max_turns` 10, the
device named by `gpu`; "cpu" for the Triton interpreter).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelagent.bench.discover import DEFAULT_SEED, DEFAULT_SPLIT, problem_split, split_fraction

DEFAULT_MAX_TURNS = 10  # KernelEnv's and KernelToolEnv's default budget


def find_problems(root: str | Path) -> list[Path]:
    """Problem files under `root` (a benchmark folder or one file), by bench's discovery."""
    from kernelagent.bench.discover import discover

    return [ref.path for ref in discover(root)]


def assign_splits(problems: dict[str, str], split: float, seed: int = DEFAULT_SEED) -> dict[str, str]:
    """{problem_id: source} -> {problem_id: "train"|"test"}, by each source's hash."""
    return {pid: problem_split(hashlib.sha256(src.encode("utf-8")).hexdigest(), split, seed)
            for pid, src in problems.items()}


def local_gpu_name() -> str | None:
    """The name of the first GPU this process may use (nvidia-smi), or None without one."""
    import subprocess

    from kernelagent.harness.caller.pool import visible_gpus

    gpus = visible_gpus()
    if not gpus:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", str(gpus[0])],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    name = out.stdout.strip().splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else ""
    return name or None


def device_for(gpu: str | None) -> tuple[dict[str, Any], bool]:
    """(device facts for the prompt, cpu?) for a GPU name, "cpu", or "auto" (this machine's
    first visible GPU, else the CPU: what an evaluator started here would use)."""
    from kernelagent.hardware import describe_device

    if gpu and gpu.lower() == "auto":
        gpu = local_gpu_name()
    if not gpu or gpu.lower() == "cpu":
        return describe_device({"cuda": False}), True
    return describe_device({"cuda": True, "gpu_name": gpu}), False


def render_prompt(problem: Any, *, mode: str, inputs: dict[str, Any], device: dict[str, Any],
                  cpu: bool, target_speedup: float, max_turns: int | None,
                  prompts: Any = None) -> list[dict]:
    """[system, user] for a problem: the templates and context `optimize` uses."""
    from kernelagent.agent import BACKEND, Prompts, first_messages, prompt_context

    prompts = prompts or Prompts()
    context = prompt_context(problem, mode=mode, backend=BACKEND, inputs=inputs, device=device, cpu=cpu,
                             target_speedup=target_speedup, max_turns=max_turns)
    return first_messages(prompts, context)


def build_rows(root: str | Path, *, mode: str = "text", gpu: str | None = "auto",
               target_speedup: float = 1.0, max_turns: int = DEFAULT_MAX_TURNS,
               split: float | None = DEFAULT_SPLIT, seed: int = DEFAULT_SEED,
               inspect_inputs: bool = True,
               progress: Callable[[int, int, Any, bool], None] | None = None) -> list[dict]:
    """One row per problem under `root`, sorted by problem id. `progress(done, total,
    problem, cached)` is called as each problem's facts are known."""
    from kernelagent.agent import Prompts
    from kernelagent.bench.discover import discover
    from kernelagent.problem import load_problem
    from kernelagent.rl.facts import inputs_for_many

    refs = discover(root)
    # A prompt needs the problem's text, not its packages: one whose imports are missing here is
    # still a prompt (bench skips it; a trainer timing it elsewhere may have them).
    problems = [load_problem(ref.path, check_dependencies=False) for ref in refs]
    ids = [ref.key for ref in refs]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"two problems have the same id: {', '.join(dup[:5])}")
    if inspect_inputs:
        inputs = inputs_for_many(problems, progress=progress)
    else:
        inputs = [{}] * len(problems)
    device, cpu = device_for(gpu)
    prompts = Prompts()
    rows = []
    for pid, problem, inp in sorted(zip(ids, problems, inputs), key=lambda x: x[0]):
        row = {"prompt": render_prompt(problem, mode=mode, inputs=inp, device=device, cpu=cpu,
                                       target_speedup=target_speedup, max_turns=max_turns,
                                       prompts=prompts),
               "problem_id": pid, "problem_source": problem.source,
               "problem_path": str(problem.path), "problem_sha256": problem.sha256}
        if split is not None:
            row["split"] = problem_split(problem.sha256, split, seed)
        rows.append(row)
    return rows


def jsonl_text(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_jsonl(rows: list[dict], path: str | Path) -> None:
    """Whole or not at all (kernelagent.files)."""
    from kernelagent.files import write_text

    write_text(path, jsonl_text(rows))


def read_jsonl(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_prompts(root: str | Path, out: str | Path, **kwargs: Any) -> dict[str, Any]:
    """Write `out` (every row); with a split also `<stem>.train.jsonl` / `<stem>.test.jsonl`.
    Returns {"rows", "train", "test", "files"}. Every output is checked before the problems are
    read, and written whole under a temporary name only once there are rows: a failure leaves
    earlier files as they were (kernelagent.files). No problem at all is a ValueError."""
    from kernelagent.files import check_output_file, write_files

    out = check_output_file(out)
    split = kwargs.get("split", DEFAULT_SPLIT) is not None
    sides = {side: out.with_name(f"{out.stem}.{side}{out.suffix or '.jsonl'}") for side in ("train", "test")} if split else {}
    for path in sides.values():
        check_output_file(path)
    rows = build_rows(root, **kwargs)
    if not rows:
        raise ValueError(f"no problem files under {root}")
    texts = {out: jsonl_text(rows)}
    info: dict[str, Any] = {"rows": len(rows)}
    for side, path in sides.items():
        part = [r for r in rows if r["split"] == side]
        texts[path] = jsonl_text(part)
        info[side] = len(part)
    write_files(texts)
    info["files"] = [str(p) for p in texts]
    return info


def node_rows(run_dirs: list[str | Path]) -> tuple[list[dict[str, Any]], int]:
    """One row per node of the search runs under `run_dirs` (kernelagent.search.records): the
    prompt the model was given (TRL's conversational `prompt`), its reply as the `completion`,
    the node's place in its tree, and the reward the RL reward gives that evaluation
    (kernelagent.rl.reward: a duplicate shares the first evaluation's, a reply without a
    candidate gets 0, a harness error None). For reward models, preference pairs between
    siblings, or offline RL. Returns (rows, search runs read)."""
    from kernelagent.rl.reward import no_code_breakdown, reward_from_result
    from kernelagent.rl.sft import find_run_dirs
    from kernelagent.search.tree import records

    rows, runs = [], 0
    for run in find_run_dirs(list(run_dirs)):
        try:
            nodes = records(run)
        except ValueError:
            continue  # a single-conversation run: no tree
        runs += 1
        for node in nodes:
            if node["verdict"] == "model_error" or node["reply"] is None:
                continue
            if not node["code"]:
                breakdown = no_code_breakdown(f"no candidate: {node['verdict']}")
            else:
                try:
                    breakdown = reward_from_result(node["harness"])
                except Exception:  # noqa: BLE001 - a record without a whole harness result
                    breakdown = None
            reward = None if breakdown is None or breakdown.infra_error else breakdown.reward
            problem = node["problem"] or {}
            rows.append({"prompt": node["messages"], "completion": [{"role": "assistant", "content": node["reply"]}],
                         "reward": reward, "verdict": node["verdict"], "passed": node["passed"],
                         "speedups": node["speedups"], "intervals": node["intervals"],
                         "problem_id": problem.get("name"), "problem_sha256": problem.get("sha256"),
                         "run_dir": node["run_dir"], "node": node["node"], "parent": node["parent"],
                         "round": node["round"], "action": node["action"], "path": node["path"],
                         "duplicate_of": node["duplicate_of"], "cost": node["cost"]})
    return rows, runs
