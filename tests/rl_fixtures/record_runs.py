"""Re-record the `optimize` runs under tests/rl_fixtures/recorded (real loop, real harness on the
CPU, scripted text-mode replies; see common.RUNS):

    python -m tests.rl_fixtures.record_runs
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tests.rl_fixtures.common import FIXTURE_RUNS, recorded_runs


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        runs = recorded_runs(Path(tmp))
        shutil.rmtree(FIXTURE_RUNS, ignore_errors=True)
        for name, path in sorted(runs.items()):
            dest = FIXTURE_RUNS / name
            dest.mkdir(parents=True)
            for file in ("trajectory.json", "summary.json", "kernel.py"):
                if (path / file).exists():
                    shutil.copy(path / file, dest / file)
            print(name, sorted(p.name for p in dest.iterdir()))


if __name__ == "__main__":
    main()
