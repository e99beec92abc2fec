"""Which tests may overlap when the suite runs in several processes (pytest-xdist, `-n`).

Registered by tests/conftest.py. Every test holds the suite lock shared from its setup to its
teardown (module and session fixtures that evaluate included), so tests overlap freely. A test
marked `alone` holds it exclusively: no other test of the session runs meanwhile. That is for a
test whose attack, where no sandbox contains it, reaches other tests' evaluations while it runs
(tests/test_hostile.py: a daemon that rewrites every job's candidate.py under /tmp until the test
kills it).

`held(config, name, exclusive)` is the same lock by another name, for a file that orders its own
tests among themselves (tests/test_hostile.py: an uncontained row leaves files in /tmp and
/dev/shm that another row's before/after comparison would count as its own).

Exclusive takers go first: a shared taker waits while one waits (a turnstile), so a stream of
short tests in the other process cannot starve an `alone` test. Without xdist there is one
process and every lock is taken at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

import pytest


def _lock_dir(config: pytest.Config) -> Path | None:
    """The folder every worker of this run shares (the parent of the workers' basetemps), or None
    outside xdist."""
    if not hasattr(config, "workerinput") or not config.option.basetemp:
        return None
    folder = Path(config.option.basetemp).parent / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def held(config: pytest.Config, name: str, exclusive: bool):
    folder = _lock_dir(config)
    if folder is None:
        yield
        return
    turnstile = os.open(folder / f"{name}.turnstile", os.O_RDWR | os.O_CREAT, 0o600)
    lock = os.open(folder / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        os.close(lock)
        os.close(turnstile)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    with held(item.config, "suite", exclusive=item.get_closest_marker("alone") is not None):
        yield
