"""Wall time of a search against one conversation, with the same candidates (issue 26).

A scripted OpenAI-compatible server on 127.0.0.1 (tests/fake_openai_server.py) serves the same
eight replies to each run, in order: four known-good ReLU kernels (benchmarks/solutions/
level1/1_relu.py at four block sizes) and four known-bad ones (a wrong output, a syntax error,
a missing ModelNew, a wrong output again), each after `--latency` seconds, as a model would.
Three runs of the agent (`kernelagent.orchestrate.optimize`, what `kernelagent optimize` runs) on
benchmarks/level1/1_relu.py through one warm evaluator, each spending all eight model calls
(the target is set out of reach so nothing stops early; the baselines are cached first):

  best-of-n --samples 4   two rounds of four calls at once, their evaluations overlapped
  best-of-n --samples 1   eight rounds of one
  single (text mode)      today's loop: one reply, one evaluation, per turn

Reported: each run's wall time (the final re-verification included), its evaluation count and
its best kernel with the speedup's interval. Timings on a CPU are not meaningful (Triton's interpreter).

    python benchmarks/search_wall.py --out search_wall.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

PROBLEM = HERE / "level1" / "1_relu.py"
GOOD = (HERE / "solutions" / "level1" / "1_relu.py").read_text(encoding="utf-8")


def replies() -> list[str]:
    good = [GOOD.replace("BLOCK_SIZE = 4096", f"BLOCK_SIZE = {b}") for b in (1024, 2048, 4096, 8192)]
    wrong = GOOD.replace("y = tl.where(x > 0, x, 0.0)", "y = tl.where(x > 0, x, 0.5 * x)")
    bad = [wrong, GOOD.replace("def relu(x", "def relu(x::"), GOOD.replace("class ModelNew", "class Model2"),
           wrong.replace("0.5 * x", "0.25 * x")]
    order = [bad[0], good[0], bad[1], good[1], good[2], bad[2], good[3], bad[3]]
    return [f"Candidate {i}.\n\n```python\n{code}```\n" for i, code in enumerate(order)]


class HttpModel:
    """A model over the scripted server with the standard library only (the GPU machine has no
    litellm): one POST to /chat/completions per query, the reply's text and token counts."""

    def __init__(self, url: str) -> None:
        self.url, self.name = url.rstrip("/") + "/chat/completions", "openai/scripted"

    def query(self, messages, tools=None):
        import urllib.request

        from kernelagent.models.base import ModelReply, Usage

        body = json.dumps({"model": "scripted", "messages": messages}).encode()
        started = time.monotonic()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            data = json.loads(response.read())
        usage = data.get("usage") or {}
        return ModelReply(content=data["choices"][0]["message"].get("content") or "",
                          usage=Usage(int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))),
                          cost_known=True, latency_s=time.monotonic() - started)


def one(label: str, options: dict, latency: float, work: Path, evaluator) -> dict:
    from kernelagent.orchestrate import optimize
    from tests.fake_openai_server import FakeOpenAIServer, text

    out = work / label.replace(" ", "_")
    with FakeOpenAIServer() as server:
        server.add(*[{**text(r), "delay": latency} for r in replies()])
        started = time.monotonic()
        run = optimize(PROBLEM, HttpModel(server.url), max_turns=8, target_speedup=1000.0, out=out,
                       evaluator=evaluator, **options)
        wall = time.monotonic() - started
        calls = len(server.requests)
    summary = run.summary
    best = summary.get("best") or {}
    row = {"run": label, "exit": run.exit_code, "wall_s": round(wall, 2), "loop_wall_s": summary.get("wall_time_s"),
           "model_calls": calls, "evaluations": (summary.get("tool_calls") or {}).get("evaluate"),
           "verifications": (summary.get("tool_calls") or {}).get("verify"),
           "tool_time_s": summary.get("tool_time_s"), "best_speedup_vs_inductor": best.get("speedup_vs_inductor"),
           "best_interval": (best.get("speedup_intervals") or {}).get("compile"),
           "timings_meaningful": best.get("timings_meaningful"),
           "search": {k: (summary.get("search") or {}).get(k) for k in ("size", "spend")}
           if summary.get("search") else None}
    print(f"{label:24} exit {run.exit_code}  wall {wall:7.1f} s  calls {calls}  evaluations {row['evaluations']}  "
          f"best {row['best_speedup_vs_inductor']} {row['best_interval']}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("search_wall.json"))
    parser.add_argument("--latency", type=float, default=2.0, help="seconds the scripted model takes per reply")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--runs", default="all", help="comma-separated subset: best-of-n-4, best-of-n-1, single")
    args = parser.parse_args()
    runs = [("best-of-n --samples 4", {"strategy": "best-of-n", "samples": 4}),
            ("best-of-n --samples 1", {"strategy": "best-of-n", "samples": 1}),
            ("single", {"strategy": "single", "mode": "text"})]
    if args.runs != "all":
        wanted = {w.strip() for w in args.runs.split(",")}
        runs = [r for r in runs if r[0].replace(" --samples ", "-") in wanted]
    from kernelagent.harness import EvalConfig, Evaluator

    rows = []
    with tempfile.TemporaryDirectory(prefix="kernelagent-search-wall-") as work, \
            Evaluator(device=args.device) as evaluator:
        fingerprint = evaluator.fingerprint()
        primed = evaluator.evaluate(PROBLEM, GOOD, EvalConfig())  # baselines cached before any run is timed
        print(f"device {fingerprint.get('gpu_name') or 'cpu'}; jobs at once {evaluator.concurrency}; "
              f"primed: {primed.status}", flush=True)
        for label, options in runs:
            rows.append(one(label, options, args.latency, Path(work), evaluator))
            args.out.write_text(json.dumps({"latency_s": args.latency, "device": fingerprint.get("gpu_name"),
                                            "rows": rows}, indent=1) + "\n")
    base = {r["run"]: r["wall_s"] for r in rows}
    if base.get("best-of-n --samples 4"):
        for other in ("best-of-n --samples 1", "single"):
            if base.get(other):
                print(f"{other} / best-of-n --samples 4: {base[other] / base['best-of-n --samples 4']:.2f}x the wall time")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
