"""Temporary bridge: `python -m kernelagent.harness.server` while the serve loop still lives in
kernelagent/harness/server.py, which this package shadows. Delete this file when server.py
moves into this package (issue 11's restructuring)."""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parents[1] / "server.py"), run_name="__main__")
