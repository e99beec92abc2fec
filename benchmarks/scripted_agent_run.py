"""One full `optimize` run with a scripted model and a known-good kernel, on the real harness.

The model's replies are scripted (read_reference, compile, run_tests, profile, submit with
the benchmark's Triton solution); everything else is what `kernelagent optimize` does. It
prints the live view's lines and, from summary.json, the outcome, speedups and the time
spent in each tool. Needs no litellm, so it runs on the GPU machines as they are.

    python benchmarks/scripted_agent_run.py [--problem level1/5_softmax] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from kernelagent.agent import Budget  # noqa: E402
from kernelagent.orchestrate import optimize  # noqa: E402
from kernelagent.agent.live import LiveView  # noqa: E402
from kernelagent.models.base import ToolCall  # noqa: E402
from kernelagent.models.scripted import ScriptedModel  # noqa: E402


def call(index: int, name: str, **arguments) -> dict:
    return {"content": "", "tool_calls": [ToolCall(f"call_{index}", name, json.dumps(arguments))],
            "usage": {"prompt_tokens": 1500, "completion_tokens": 400}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problem", default="level1/5_softmax")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    problem = HERE / f"{args.problem}.py"
    code = (HERE / "solutions" / f"{args.problem}.py").read_text()
    model = ScriptedModel([
        call(1, "read_reference"),
        call(2, "compile", code=code),
        call(3, "run_tests", code=code),
        call(4, "profile", code=code),
        call(5, "submit", code=code),
    ], name="scripted-known-good")
    out = args.out or Path(tempfile.mkdtemp(prefix="kernelagent-scripted-"))
    budget = Budget(max_turns=8)
    with LiveView(budget, live=False) as view:
        run = optimize(problem, model, mode="tools", out=out, device=args.device, budget=budget, observer=view)
    summary = run.summary
    print(json.dumps({k: summary[k] for k in ("outcome", "exit_code", "stop_reason", "device", "target_check",
                                               "turns", "tokens", "wall_time_s", "tool_time_s", "tool_calls")},
                     indent=1))
    best = summary.get("best") or {}
    print("speedup vs eager:", best.get("speedup_vs_eager"), " vs inductor:", best.get("speedup_vs_inductor"),
          " timings_ms:", best.get("timings_ms"))
    print("outputs:", sorted(p.name for p in out.iterdir()))


if __name__ == "__main__":
    main()
