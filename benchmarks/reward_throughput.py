"""Throughput of the RL reward: a batch of completions scored by `KernelReward` on the
evaluator pool (all visible GPUs, in parallel) against the same completions scored one by
one on one evaluator. Reports rewards per GPU-minute.

The batch (64 by default) mixes, for each of 8 level-1 problems: the benchmark's solution
and two copies that differ only in a comment (correct), two deliberately slow correct
kernels (the solution's forward run 4x and 16x), two wrong ones (outputs perturbed), and one
that does not compile. Completions are chat-format, as TRL passes them.

    python benchmarks/reward_throughput.py --out reward_throughput.json          # GPU machine
    python benchmarks/reward_throughput.py --device cpu --cpu-workers 2 --n 16   # smoke run

Baseline timings (eager, torch.compile) are cached per problem; the first pass over a cold
cache pays for them, so the batch is scored twice (cold, then warm) and the one-by-one pass
runs warm. Timings exclude harness start-up (evaluators are started before timing).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

PROBLEMS = ["1_relu", "2_gelu", "4_mean_dim", "5_softmax", "6_layernorm", "8_matmul",
            "12_cumsum", "13_transpose"]

WRONG_TAIL = """

_kernelagent_forward = ModelNew.forward


def _perturbed_forward(self, *args, **kwargs):
    out = _kernelagent_forward(self, *args, **kwargs)
    return out * {scale} + {shift}


ModelNew.forward = _perturbed_forward
"""

SLOW_TAIL = """

_kernelagent_forward = ModelNew.forward


def _slow_forward(self, *args, **kwargs):
    for _ in range({repeats} - 1):
        _kernelagent_forward(self, *args, **kwargs)
    return _kernelagent_forward(self, *args, **kwargs)


ModelNew.forward = _slow_forward
"""


def variants(solution: str) -> list[tuple[str, str]]:
    """(kind, code): 3 correct, 2 slow correct, 2 wrong, 1 compile error."""
    return [
        ("correct", solution),
        ("correct", solution + "\n# variant 1\n"),
        ("correct", solution + "\n# variant 2\n"),
        ("slow", solution + SLOW_TAIL.format(repeats=4)),
        ("slow", solution + SLOW_TAIL.format(repeats=16)),
        ("wrong", solution + WRONG_TAIL.format(scale=1.05, shift=0.0)),
        ("wrong", solution + WRONG_TAIL.format(scale=1.0, shift=0.01)),
        ("compile_error", solution.replace("class ModelNew", "class ModelNew(", 1)),
    ]


def build_batch(n: int) -> tuple[list, list[str], list[str], list[str]]:
    completions, sources, ids, kinds = [], [], [], []
    for name in PROBLEMS:
        problem = HERE / "level1" / f"{name}.py"
        solution = (HERE / "solutions" / "level1" / f"{name}.py").read_text()
        for kind, code in variants(solution):
            completions.append([{"role": "assistant",
                                 "content": f"Plan: one fused pass.\n\n```python\n{code}```"}])
            sources.append(problem.read_text())
            ids.append(f"level1/{name}")
            kinds.append(kind)
    pick = list(range(len(completions)))[:n]  # problem by problem, every kind of each
    return ([completions[i] for i in pick], [sources[i] for i in pick], [ids[i] for i in pick],
            [kinds[i] for i in pick])


def score(reward, completions, sources, ids) -> tuple[float, list]:
    start = time.monotonic()
    values = reward(prompts=[[]] * len(completions), completions=completions,
                    completion_ids=[[0]] * len(completions), trainer_state=None,
                    problem_source=sources, problem_id=ids)
    return time.monotonic() - start, values


def summary(label: str, wall: float, n: int, gpus: int, values: list, breakdowns: list) -> dict:
    per_gpu_min = n / (wall / 60.0) / max(1, gpus)
    out = {"wall_s": round(wall, 2), "completions": n, "gpus": gpus,
           "rewards_per_minute": round(n / (wall / 60.0), 1),
           "rewards_per_gpu_minute": round(per_gpu_min, 1),
           "statuses": dict(Counter(b.status for b in breakdowns)),
           "mean_reward": round(sum(v for v in values if v is not None) / max(1, len(values)), 4),
           "none": sum(v is None for v in values)}
    print(f"{label:>22}: {wall:8.1f} s  {out['rewards_per_minute']:8.1f} rewards/min  "
          f"{per_gpu_min:8.1f} rewards/GPU-min  {out['statuses']}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=64, help="completions in the batch (at most 64)")
    parser.add_argument("--device", default="auto", help="auto (all visible GPUs) or cpu")
    parser.add_argument("--cpu-workers", type=int, default=2)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from kernelagent.harness import EvalConfig
    from kernelagent.harness.caller.pool import EvaluatorPool, visible_gpus
    from kernelagent.rl import KernelReward

    completions, sources, ids, kinds = build_batch(min(args.n, 64))
    gpus = [] if args.device == "cpu" else visible_gpus()
    devices = [f"cuda:{i}" for i in gpus] if gpus else ["cpu"] * args.cpu_workers
    config = EvalConfig(trials=args.trials)
    cache = tempfile.mkdtemp(prefix="kernelagent-reward-throughput-")
    print(f"devices: {devices}; batch: {len(completions)} completions {dict(Counter(kinds))}")
    report: dict = {"devices": devices, "batch": dict(Counter(kinds)), "trials": args.trials}
    n_units = len(gpus) or 1  # GPU-minutes; on the CPU, per machine

    with EvaluatorPool(devices=devices, cache_dir=cache) as pool:
        for ev in pool.evaluators:
            ev.fingerprint()  # start every harness server before timing
        report["fingerprint"] = {k: v for k, v in pool.fingerprint().items()
                                 if k in ("gpu_name", "driver", "torch", "triton", "cuda")}
        reward = KernelReward(pool, eval_config=config, dedupe=True)
        wall, values = score(reward, completions, sources, ids)
        report["batch_cold"] = summary("batch (cold baselines)", wall, len(values), n_units, values, reward.last)
        wall, values = score(reward, completions, sources, ids)
        report["batch_warm"] = summary("batch (warm)", wall, len(values), n_units, values, reward.last)
        report["by_kind"] = {kind: round(sum(v or 0 for v, k in zip(values, kinds) if k == kind)
                                         / max(1, kinds.count(kind)), 4) for kind in sorted(set(kinds))}
        batch_values = values

    with EvaluatorPool(devices=devices[:1], cache_dir=cache) as single:
        single.evaluators[0].fingerprint()
        reward = KernelReward(single, eval_config=config)
        start, values, breakdowns = time.monotonic(), [], []
        for i in range(len(completions)):
            _, v = score(reward, completions[i:i + 1], sources[i:i + 1], ids[i:i + 1])
            values.extend(v)
            breakdowns.extend(reward.last)
        report["one_by_one"] = summary("one by one (1 device)", time.monotonic() - start,
                                       len(values), 1, values, breakdowns)
    report["batch_speedup_wall"] = round(report["one_by_one"]["wall_s"] / report["batch_warm"]["wall_s"], 2)
    report["same_verdicts"] = [b is None for b in batch_values] == [v is None for v in values] and \
        all(abs((a or 0) - (b or 0)) < 1e-9 or k in ("correct", "slow")
            for a, b, k in zip(batch_values, values, kinds))
    print(f"batch vs one by one: {report['batch_speedup_wall']}x wall-clock; "
          f"mean reward by kind: {report['by_kind']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
