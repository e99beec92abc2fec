"""After Ctrl-C: stop a harness server at once.

The server runs in its own process group, so a terminal's SIGINT does not reach it, and
`Evaluator.close()` asks it to shut down and waits (up to 10 s) for a job it is still
running. After an interrupt nobody wants that job: the server is killed first, then closed
as usual (scratch directories removed), so the command exits within a second or two.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any


def stop_now(evaluator: Any) -> None:
    abort = getattr(evaluator, "abort", None)  # the harness's own, where it has one
    if callable(abort):
        abort()
        return
    kill = getattr(evaluator, "_kill_server", None)
    if callable(kill):
        lock = getattr(evaluator, "_lock", None)
        try:
            with lock if lock is not None else nullcontext():
                kill()
        except Exception:  # already gone: close() below tidies up
            pass
    evaluator.close()
