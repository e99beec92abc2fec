"""Runs: the orchestration above the agent (kernelagent/agent) and the search (kernelagent/search).

    run.py          optimize(): one problem, the agent loop or a search, its output folder
    records.py      what a run keeps and reads back (summary.json, resume, the output folder)
    whole_model.py  optimize_whole_model(): plan a model, optimise its hottest regions in one
                    budget, splice the kernels, verify end to end; Ctrl-C and --resume
    whole_report.py the whole model's report.html

    from kernelagent.orchestrate import optimize
    run = optimize("problem.py", model, out="runs/x")
"""

from kernelagent.orchestrate.records import OptimizeRun, build_summary, check_strategy, default_out_dir, resumable
from kernelagent.orchestrate.run import optimize

__all__ = ["OptimizeRun", "build_summary", "check_strategy", "default_out_dir", "optimize", "resumable"]
