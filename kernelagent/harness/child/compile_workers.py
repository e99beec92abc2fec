"""Inductor's compile workers for a reference process's torch.compile baselines (reference_side.py
compile_runners): the caller's TORCHINDUCTOR_COMPILE_THREADS, else the server's share of the
host's CPUs per job (server/main.py share_compile_workers, through KERNELAGENT_COMPILE_WORKERS)."""

from __future__ import annotations

import os

from kernelagent import settings
from kernelagent.harness.config import COMPILE_WORKERS_ENV


def set_compile_workers() -> int | None:
    """Inductor's compile workers for this process's baselines: TORCHINDUCTOR_COMPILE_THREADS where
    the caller set it, else the server's share of the host's CPUs per job
    (KERNELAGENT_COMPILE_WORKERS, server/main.py share_compile_workers). Inductor reads its own
    variable once, when its config is first imported, which a server forked from the zygote may
    have done under another environment: so the value is set on its config here, before
    anything compiles. None (Inductor's choice stands) where neither is a positive integer."""
    value = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", "").strip()
    if not value:
        try:
            value = str(settings.get(COMPILE_WORKERS_ENV) or "")
        except ValueError:  # not a positive integer
            return None
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        return None
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = int(value)
    return inductor_config.compile_threads
