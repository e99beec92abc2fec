"""A whole model end to end with scripted known-good region kernels (issue 27's GPU report).

`kernelagent plan` on MODEL, then the whole-model pipeline (kernelagent/orchestrate/whole_model.py):
the agent runs on every region whose ops have a kernel here (a scripted model answers each such
region's task with that kernel, in text mode), the verified kernels are spliced alone and then
together, and the spliced model is evaluated against the original end to end. Reported: the plan's
table with the regions' summed time against torch.profiler's total for the model's own forward,
each region's fate, the end-to-end speedup with its interval, and the wall time of each part.

    python benchmarks/whole_model_run.py ../shared/kernelbench/KernelBench/level3/44_MiniGPTBlock.py \\
        --kernel layer_norm=tests/wholemodel/layernorm_kernel.py --out whole.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


class ScriptedRegions:
    """Answers a region's task with the kernel for its ops; a reply without code otherwise."""

    name = "scripted-regions"

    def __init__(self, kernels: dict[str, str]) -> None:
        self.kernels = kernels

    def query(self, messages, tools=None):
        from kernelagent.models.base import ModelReply

        task = messages[1]["content"]
        for ops, code in self.kernels.items():
            if f"({ops})." in task:
                return ModelReply(content=f"```python\n{code}```", cost_known=True)
        return ModelReply(content="No kernel for this region.", cost_known=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--kernel", action="append", default=[], metavar="OPS=PATH",
                        help="a region's ops as the plan lists them, comma-separated, and its kernel file")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--turns-per-region", type=int, default=2, help="the shared turn budget, per region with a kernel")
    parser.add_argument("--out", type=Path, default=Path("whole_model.json"))
    args = parser.parse_args()

    from kernelagent.agent import Budget
    from kernelagent.devices import gpu_indices
    from kernelagent.harness import Evaluator
    from kernelagent.wholemodel.plan import make_plan, render
    from kernelagent.orchestrate.whole_model import optimize_whole_model

    kernels = {}
    for item in args.kernel:
        ops, _, path = item.partition("=")
        kernels[", ".join(o.strip() for o in ops.split(","))] = Path(path).read_text(encoding="utf-8")
    device = args.device if args.device != "auto" else ("cuda" if gpu_indices() else "cpu")
    report: dict = {"model": str(args.model), "device": device}
    with tempfile.TemporaryDirectory(prefix="kernelagent-whole-") as work:
        work = Path(work)
        started = time.monotonic()
        plan = make_plan(args.model, work / "plan", device=device)
        report["plan_s"] = round(time.monotonic() - started, 2)
        print(render(plan, 15), flush=True)
        report["totals"] = plan["totals"]
        report["regions"] = [{k: r[k] for k in ("id", "kind", "ops", "share", "time_us", "amdahl_bound",
                                                "extractable", "why_not")} for r in plan["regions"]]
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
        chosen = [r for r in plan["regions"] if r["extractable"] and ", ".join(dict.fromkeys(r["ops"])) in kernels]
        print(f"plan: {report['plan_s']} s; regions with a kernel: {[r['id'] for r in chosen]}", flush=True)
        ordered = {**plan, "regions": chosen + [r for r in plan["regions"] if r not in chosen]}
        with Evaluator(device=device) as evaluator:
            evaluator.fingerprint()
            started = time.monotonic()
            summary = optimize_whole_model(args.model, ScriptedRegions(kernels), out=work / "run",
                                           evaluator=evaluator, budget=Budget(max_turns=max(1, args.turns_per_region * len(chosen))),
                                           device=device, top=len(chosen), min_share=0.0, trials=args.trials,
                                           mode="text", plan_data=ordered)
            report["whole_s"] = round(time.monotonic() - started, 2)
        report["summary"] = summary
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    for row in summary["regions"][:12]:
        print(f"{row['region']:10} {row['kind'][:16]:16} share {row['share']:.2%}  {row['status']:13} "
              f"kernel {row.get('kernel_speedup')}  alone e2e {row.get('e2e_alone_speedup')}  {row.get('why', '')[:90]}")
    print(f"end to end: {summary['verdict']}, {summary.get('e2e_speedup')} {summary.get('e2e_interval')} vs "
          f"{summary.get('e2e_baseline')}; vs eager {summary.get('e2e_vs_eager')} "
          f"{(summary.get('e2e_intervals') or {}).get('eager')}; spliced {summary['spliced']}; whole run "
          f"{report['whole_s']} s (plan {report['plan_s']} s)")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
