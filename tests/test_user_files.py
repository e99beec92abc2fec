"""Issue 56: nothing a user had is lost, and every command we print works as printed.

At the CLI, as a user meets it: a failed command leaves the user's earlier files as they were
(outputs are checked first and written whole under a temporary name), a failure of the user's
own files (store, output path) is one line and exit 2 before anything is recorded, and a
command the CLI prints runs as printed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelagent.cli import app
from kernelagent.rl.sft import stats_path_for
from tests.rl_fixtures.common import FIXTURE_RUNS
from tests.test_cli_errors import ENV, check_one_line


def run(args: list[str]):
    return CliRunner().invoke(app, [str(a) for a in args], env=ENV)


def earlier_outputs(folder: Path) -> dict[Path, str]:
    """What an earlier, successful run of each writer left in `folder`."""
    texts = {folder / "prompts.jsonl": '{"prompt": "earlier"}\n',
             folder / "prompts.train.jsonl": '{"prompt": "earlier train"}\n',
             folder / "prompts.test.jsonl": '{"prompt": "earlier test"}\n',
             folder / "sft.jsonl": '{"messages": "earlier"}\n',
             folder / "sft.stats.json": '{"rows": 1}\n',
             folder / "nodes.jsonl": '{"node": "earlier"}\n'}
    for path, text in texts.items():
        path.write_text(text)
    return texts


# (args with {empty} and {out}, exit code, a piece of the one stderr line)
FAILED_WRITES = [
    (["dataset", "prompts", "{empty}", "--out", "{out}/prompts.jsonl", "--no-inputs"], 2, "no problem files under"),
    (["export", "sft", "{empty}", "--out", "{out}/sft.jsonl"], 2, "no run folders"),
    (["export", "sft", FIXTURE_RUNS, "--out", "{out}/sft.jsonl"], 1, "no row to export"),
    (["dataset", "nodes", "{empty}", "--out", "{out}/nodes.jsonl"], 2, "no search runs found"),
    (["dataset", "prompts", "{empty}", "--out", "{out}", "--no-inputs"], 2, "is a folder, not a file"),
]


@pytest.mark.parametrize("args,code,piece", FAILED_WRITES, ids=[" ".join(map(str, a[:2])) + f" {c}" for a, c, _p in FAILED_WRITES])
def test_a_failed_command_leaves_earlier_outputs_as_they_were(tmp_path, args, code, piece):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    before = earlier_outputs(out)
    result = run([str(a).format(empty=empty, out=out) for a in args])
    check_one_line(result.exit_code, result.stdout, result.stderr, code, piece)
    assert {p: p.read_text() for p in before} == before
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in before)  # nothing new, no temporary


def test_export_sft_of_cpu_runs_writes_nothing_and_says_why(tmp_path):
    out = tmp_path / "sft.jsonl"
    result = run(["export", "sft", FIXTURE_RUNS, "--out", out])
    check_one_line(result.exit_code, result.stdout, result.stderr, 1, "--include-unmeasured")
    assert not out.exists() and not stats_path_for(out).exists() and list(tmp_path.iterdir()) == []


def test_a_successful_export_replaces_the_earlier_one_whole(tmp_path):
    out = tmp_path / "sft.jsonl"
    earlier_outputs(tmp_path)
    result = run(["export", "sft", FIXTURE_RUNS, "--out", out, "--min-speedup", "0"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all("messages" in r and r["messages"] != "earlier" for r in rows)
    assert json.loads(stats_path_for(out).read_text())["rows"] == len(rows)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~current_umask())


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
