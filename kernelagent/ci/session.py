"""What verify and regenerate share: the store, the harness, and bad input as UserError."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kernelagent.ci.verify import CachedEvaluator
from kernelagent.errors import UserError


@contextmanager
def open_cached_evaluator(*, store: Path | None, device: str, cache_dir: Path | None,
                          isolation: str, run_id: str, jobs_per_gpu: int = 0,
                          daemon: bool | None = None) -> Iterator[CachedEvaluator]:
    """The store and a started Evaluator (`daemon`: this user's warm harness, as
    Evaluator(daemon=) takes it; the CLI resolves --daemon/--no-daemon to a bool)."""
    from kernelagent.bench.store import default_store_path, open_store
    from kernelagent.harness import Evaluator, HarnessStartError

    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise UserError(f"--device must be auto, cpu, cuda or cuda:N (got {device!r})")
    if isolation not in ("auto", "bwrap", "namespaces", "none"):
        raise UserError(f"--isolation must be auto, bwrap, namespaces or none (got {isolation!r})")
    store_path = store or default_store_path()
    db = open_store(store_path)  # a folder, not a database, locked, unwritable: one line
    try:
        with Evaluator(device=device, cache_dir=cache_dir, isolation=isolation,
                       concurrency=jobs_per_gpu, daemon=daemon) as evaluator:
            cached = CachedEvaluator(evaluator, db, run_id)
            try:
                cached.fingerprint()  # starts the harness: a broken setup fails here, in one line
            except HarnessStartError as exc:
                raise UserError(f"the evaluation harness could not start: {str(exc).splitlines()[0]}") from None
            yield cached
    finally:
        db.close()
