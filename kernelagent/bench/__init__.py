"""Batch runs over a benchmark directory: discovery, a SQLite store with resume, progress,
metrics and offline reports.

    from kernelagent.bench import BenchSpec, Session, run_bench
    outcome = run_bench(BenchSpec(root="benchmarks", candidates="benchmarks/solutions"), Session())
    outcome.metrics["correctness_rate"], outcome.out_dir / "report.html"

Importing this package does not import torch (the harness runs in its own processes).
"""

from kernelagent.bench.discover import ProblemRef, discover, find_candidates
from kernelagent.bench.metrics import compute as compute_metrics
from kernelagent.bench.runner import BenchOutcome, BenchSpec, Session, run_bench
from kernelagent.bench.store import Store, default_store_path, evaluation_key

__all__ = ["BenchOutcome", "BenchSpec", "ProblemRef", "Session", "Store", "compute_metrics", "default_store_path",
           "discover", "evaluation_key", "find_candidates", "run_bench"]
