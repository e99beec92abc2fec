"""`kernelagent optimize MODEL --whole-model` the way a user runs it (issue 43), on the CPU, with a
scripted model (`--model scripted:FILE`: no key, no server): tests/wholemodel/tiny.py has two
regions (a LayerNorm, a linear layer) and tests/wholemodel/tiny_kernel.py is right for both.

One run serves most of the file (a whole model costs a minute here): its first session talks to
the fake model server (tests/fake_openai_server.py), which answers the first region's call with
the kernel and holds the second region's call unanswered; the Ctrl-C (SIGINT to its process
group) is sent once the server holds that call, so it always lands while the run waits there,
with the first region finished and the second in flight: what is kept is what the code decides
at that point, never a race with the splice checks. Then `--resume` with a budget of two model
calls finishes it with the scripted model. Checked: progress on stderr per region and per turn;
Ctrl-C keeps the summary, the report and the finished region and says how to go on; the resumed
run buys nothing twice and splices both kernels; `eval --whole-model` judges the run's own
model_optimized.py (and a model with one region spliced) with the run's rules and counts the
spliced kernels as the candidate's own; the report has the bench report's look, percentages and
links to each region. A second, in-process run prints the plan's own warning and reports a
region the budget never reached as `not attempted`."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.fake_openai_server import FakeOpenAIServer, text
from tests.test_interrupt import start

pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="process groups and SIGINT"),
              pytest.mark.xdist_group("wholemodel_cli")]

HERE = REPO / "tests" / "wholemodel"
TINY = HERE / "tiny.py"
MODEL = f"scripted:{HERE / 'tiny_kernel.py'}"
COMMON = ["--whole-model", "--model", MODEL, "--device", "cpu", "--no-live"]


class Run:
    """A `kernelagent` process whose stderr is read line by line as it comes."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.proc = start(args, cwd)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stderr.readline, "")),
                                       daemon=True)
        self.reader.start()

    def wait_for(self, pattern: str, timeout: float = 400) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(re.search(pattern, line) for line in self.lines):
                return
            if self.proc.poll() is not None:
                time.sleep(0.5)
                pytest.fail(f"exited ({self.proc.returncode}) before {pattern!r}:\n{''.join(self.lines)[-3000:]}")
            time.sleep(0.1)
        os.killpg(self.proc.pid, signal.SIGKILL)
        pytest.fail(f"no {pattern!r} within {timeout:.0f} s:\n{''.join(self.lines)[-3000:]}")

    def finish(self, timeout: float = 400) -> tuple[int, str, str]:
        try:
            stdout = self.proc.stdout.read()
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.reader.join(10)
        return self.proc.returncode, stdout, "".join(self.lines)


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """(exit code, stdout, stderr, OUT, model calls) of the first session, Ctrl-C'd while the fake
    server holds the second region's model call (the first region has its kernel by then)."""
    tmp = tmp_path_factory.mktemp("whole")
    out = tmp / "run"
    kernel = text(f"```python\n{(HERE / 'tiny_kernel.py').read_text().rstrip()}\n```")
    with FakeOpenAIServer([kernel, {"delay": 600, "content": "never in time"}]) as server:
        run = Run(["optimize", str(TINY), "--whole-model", "--model", "openai/fake", "--api-base", server.url,
                   "--model-timeout", "900", "--device", "cpu", "--no-live", "--regions", "2", "--max-turns", "2",
                   "--trials", "1", "--mode", "text", "--out", str(out)], tmp)
        deadline = time.monotonic() + 400
        while len(server.requests) < 2:  # the run is inside the second region's call from here on
            if run.proc.poll() is not None or time.monotonic() > deadline:
                os.killpg(run.proc.pid, signal.SIGKILL)
                pytest.fail(f"the second model call never came:\n{''.join(run.lines)[-3000:]}")
            time.sleep(0.1)
        os.killpg(run.proc.pid, signal.SIGINT)
        code, stdout, stderr = run.finish()
        calls = len(server.requests)
    return code, stdout, stderr, out, calls


@pytest.fixture(scope="module")
def resumed(interrupted):
    """(exit code, stdout, stderr, OUT) of `--resume OUT` with a budget of two model calls."""
    out = interrupted[3]
    run = Run(["optimize", str(TINY), *COMMON, "--resume", str(out), "--max-turns", "2"], out.parent)
    code, stdout, stderr = run.finish()
    return code, stdout, stderr, out


def test_progress_is_shown_per_region_and_per_turn(interrupted):
    stderr = interrupted[2]
    for expected in (r"^planning tiny: profiling its forward on cpu", r"^plan: 2 regions; optimising 2: region_0 \(",
                     r"^region 1/2: region_\d \(", r"^turn 1/2: model -> text reply",
                     r"^turn 1: evaluate -> correct", r"^region_\d: kernel found", r"^region 2/2: region_\d \("):
        assert re.search(expected, stderr, re.MULTILINE), (expected, stderr)


def test_ctrl_c_keeps_the_summary_the_report_and_every_finished_region(interrupted):
    code, stdout, stderr, out, calls = interrupted
    assert code == 130 and calls == 2, (stdout, stderr)
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted: 1 of 2 regions finished; kernels kept: region_"), last
    assert f"to go on: kernelagent optimize {TINY} --whole-model --resume {out}" in last
    assert "Traceback" not in stderr + stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"] == "interrupted" and summary["budget"]["turns"] == 1  # the held call bought nothing
    assert summary["exit_code"] == 130
    found = [r for r in summary["regions"] if r["status"] == "kernel found"]
    cut = [r for r in summary["regions"] if r["status"] == "interrupted"]
    assert len(found) == 1 and len(cut) == 1, summary["regions"]
    assert Path(found[0]["kernel"]).is_file() and (out / found[0]["run"] / "trajectory.json").is_file()
    assert found[0]["turns"] == 1 and cut[0]["turns"] == 0
    assert cut[0]["why"] == "interrupted during its run; no correct kernel yet", cut[0]
    assert "before the end-to-end checks" in found[0]["why"] and not (out / "model_optimized.py").exists()
    report = (out / "report.html").read_text()
    assert "interrupted" in report and "--resume" in report


def test_resume_finishes_the_run_and_buys_nothing_twice(interrupted, resumed):
    code, stdout, stderr, out = resumed
    assert code == 0, (stdout, stderr)
    assert "whole model: correct; regions spliced: region_0, region_1" in stdout
    assert re.search(r"^region 2/2: region_\d", stderr, re.MULTILINE) and "region 1/2" not in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["sessions"] == 2 and summary["passed"]
    assert summary["exit_code"] == code == 0
    assert summary["budget"]["turns"] == 2  # one call per region, over both sessions
    assert sorted(summary["spliced"]) == ["region_0", "region_1"]
    assert all(r["turns"] == 1 and r["status"] == "spliced" for r in summary["regions"]), summary["regions"]


def test_resume_refuses_other_settings_and_other_runs(interrupted, tmp_path):
    from typer.testing import CliRunner

    from kernelagent.cli import app

    out = interrupted[3]
    env = {"CUDA_VISIBLE_DEVICES": "", "KERNELAGENT_MODEL": None, "KERNELAGENT_API_BASE": None,
           "KERNELAGENT_API_KEY": None}
    other = CliRunner().invoke(app, ["optimize", str(TINY), *COMMON, "--resume", str(out), "--strategy", "beam",
                                     "--samples", "2"], env=env)
    assert other.exit_code == 2 and "--strategy beam differs" in other.stderr, other.output
    plain = CliRunner().invoke(app, ["optimize", str(TINY), "--model", MODEL, "--resume", str(out)], env=env)
    assert plain.exit_code == 2 and "is a whole-model run: add --whole-model" in plain.stderr, plain.output
    nothing = CliRunner().invoke(app, ["optimize", str(TINY), *COMMON, "--resume", str(tmp_path)], env=env)
    assert nothing.exit_code == 2 and "no whole-model run there" in nothing.stderr, nothing.output


def test_eval_whole_model_judges_a_spliced_model_as_the_run_did(resumed, tmp_path):
    """A model with one region spliced (PyTorch runs the other): plain `eval` rejects it and says how
    to judge it; `eval --whole-model` says correct, and the spliced kernels are the candidate's own."""
    from typer.testing import CliRunner

    from kernelagent.cli import app

    out = resumed[3]
    alone = out / "splices" / "region_0.py"
    env = {"CUDA_VISIBLE_DEVICES": "", "KERNELAGENT_CACHE_DIR": str(tmp_path / "cache")}
    judged = CliRunner().invoke(app, ["eval", str(TINY), str(alone), "--whole-model", "--trials", "1",
                                      "--no-timing"], env=env)
    assert judged.exit_code == 0, judged.output
    assert "PASS: correct" in judged.stdout
    ran = re.search(r"own kernels ran (\d+) times", " ".join(judged.stdout.split()))
    assert ran and int(ran.group(1)) > 0, judged.stdout  # the spliced kernel counted as the candidate's
    assert "exec(" not in alone.read_text()  # the kernels are code in the file, not strings run through exec
    strict = CliRunner().invoke(app, ["eval", str(TINY), str(alone), "--trials", "1", "--no-timing"], env=env)
    assert strict.exit_code == 1 and "--whole-model" in strict.stderr, strict.output


def test_the_report_looks_like_the_bench_report_with_percentages_and_links(resumed):
    out = resumed[3]
    report = (out / "report.html").read_text()
    assert '<div class="cards">' in report and '<table class="sortable" id="regions">' in report
    assert "<style>" in report and report.count("<script>") == 1
    summary = json.loads((out / "summary.json").read_text())
    for row in summary["regions"]:
        assert f"{100 * row['share']:.1f}%" in report  # shares as the plan prints them
    links = re.findall(r'href="([^"]+)"', report)
    for target in ("regions/region_0/summary.json", "regions/region_1/kernel.py", "model_optimized.py",
                   "plan/plan.json"):
        assert target in links, (target, links)
    assert all((out / link).exists() for link in links), links
    assert "kernelagent eval" in report and "--whole-model" in report


def test_eval_whole_model_says_correct_for_the_runs_own_model_optimized(resumed, tmp_path):
    """The issue's check, as a user repeats it: `kernelagent eval ORIGINAL OUT/model_optimized.py
    --whole-model` on what the run wrote says correct, with the spliced kernels as the candidate's."""
    from typer.testing import CliRunner

    from kernelagent.cli import app

    code, _stdout, _stderr, out = resumed
    assert code == 0
    final = out / "model_optimized.py"
    assert json.loads((out / "summary.json").read_text())["model_optimized"] == str(final)
    assert final.read_text().count("@triton.jit") >= 2  # both regions' kernels, as code in the file
    env = {"CUDA_VISIBLE_DEVICES": "", "KERNELAGENT_CACHE_DIR": str(tmp_path / "cache")}
    judged = CliRunner().invoke(app, ["eval", str(TINY), str(final), "--whole-model", "--trials", "1", "--json"],
                                env=env)
    assert judged.exit_code == 0, judged.output
    result = json.loads(judged.stdout.strip().splitlines()[-1])
    assert result["status"] == "correct", result  # exit 0: it passed
    # The spliced kernels are the candidate's own: a check where they ran 0 times is no-custom-kernel
    # (the "own kernels ran 0 times"), PyTorch doing a region's work is torch-work.
    kinds = {f["kind"] for f in result["flags"]}
    assert not kinds & {"no-custom-kernel", "torch-work", "fallback-to-reference", "tampering"}, result["flags"]
    assert not [f for f in result["flags"] if f["severity"] == "reject"], result["flags"]
    assert result["trials"] and all(t["passed"] for t in result["trials"]), result["trials"]
    shown = CliRunner().invoke(app, ["eval", str(TINY), str(final), "--whole-model", "--trials", "1",
                                     "--no-timing"], env=env)
    assert shown.exit_code == 0 and "PASS: correct" in shown.stdout, shown.output
    assert re.search(r"correct\s+yes \((\d+)/\1 checks\)", shown.stdout), shown.stdout


def test_whole_model_prints_the_plans_warning_and_a_region_the_budget_never_reached(tmp_path, monkeypatch):
    """A plan whose regions and forward disagree (3534% on a loaded CPU) was shown by `plan` and
    silently dropped by `optimize --whole-model`; a region reached with the budget spent is `not
    attempted`, with the budget that was spent."""
    from typer.testing import CliRunner

    import kernelagent.wholemodel.plan as plan_module
    from kernelagent.cli import app
    from kernelagent.wholemodel.child import agreement_warning

    real = plan_module.make_plan

    def disagreeing(problem, out, device="cpu", **kw):
        data = real(problem, out, device=device, **kw)
        data["totals"].update(nodes_us=3534.1, model_forward_us=100.0, nodes_vs_model=35.341)
        data["totals"]["warning"] = agreement_warning(data["totals"], cuda=False)
        return data

    monkeypatch.setattr(plan_module, "make_plan", disagreeing)
    env = {"CUDA_VISIBLE_DEVICES": "", "KERNELAGENT_CACHE_DIR": str(tmp_path / "cache"), "KERNELAGENT_MODEL": None,
           "KERNELAGENT_API_BASE": None, "KERNELAGENT_API_KEY": None}
    result = CliRunner().invoke(app, ["optimize", str(TINY), *COMMON, "--regions", "2", "--max-turns", "1",
                                      "--trials", "1", "--mode", "text", "--out", str(tmp_path / "run")], env=env)
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    plan_at = next(i for i, line in enumerate(lines) if line.startswith("plan: 2 regions"))
    assert lines[plan_at + 1].startswith("warning: the regions sum to 3534% of the model's own forward"), lines
    assert "rough guide" in lines[plan_at + 1]
    assert re.search(r"^region_\d: not attempted: the shared budget was spent before it \(1/1 turns\)$",
                     result.stderr, re.MULTILINE), result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [r["status"] for r in summary["regions"]].count("not attempted") == 1, summary["regions"]
