"""Whole models (issue 27) on the CPU: plan finds and ranks the regions of KernelBench level-3 models
(derived smoke sizes) and of a transformer block built here; every extracted region is a problem the
harness accepts and its own reference passes; a scripted model's kernels for two regions are
spliced and the spliced model passes end to end; a wrong region kernel is left out with its reason.
CPU times are not device times: only the pipeline is checked, never a speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelagent.agent import Budget
from kernelagent.harness import EvalConfig, Status
from kernelagent.models.base import ModelReply
from kernelagent.wholemodel.plan import PlanError, make_plan, render, splice
from kernelagent.wholemodel.regions import group
from tests.conftest import REPO

# One worker for the file (pytest-xdist): its module fixtures (the block plan) are made once.
pytestmark = pytest.mark.xdist_group("wholemodel")

HERE = Path(__file__).resolve().parent / "wholemodel"
KB3 = REPO.parent / "shared" / "kernelbench" / "KernelBench" / "level3"
LN_KERNEL = (HERE / "layernorm_kernel.py").read_text()
LINEAR_ADD_KERNEL = (HERE / "linear_add_kernel.py").read_text()
NO_DEFENCES = EvalConfig(trials=1, defences=False, baselines=False)


@pytest.fixture(scope="module")
def block_plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("block")
    return make_plan(HERE / "block.py", out, device="cpu"), out


def region(plan: dict, ops: list[str]) -> dict:
    return next(r for r in plan["regions"] if r["ops"] == ops)


def assert_ranked_within_the_noise(regions: list[dict]) -> None:
    """The plan's order (regions.rank): hottest first, except that regions whose shares are within
    their noise of the hottest of their group keep graph order. So a region may go ahead of a hotter
    one only inside a group (no clear lead between them), and every group is hotter than the next.
    A strict sort by time failed a CI run: two regions 3 us apart on the CPU, within their noise."""
    groups: list[list[dict]] = [[]]
    for r in regions:
        groups[-1].append(r)
        if r["clear_lead"]:
            groups.append([])
    groups = [g for g in groups if g]
    assert groups and regions[-1]["clear_lead"], [r["clear_lead"] for r in regions]
    for members in groups:
        head = max(members, key=lambda r: r["share"])
        for r in members:
            assert head["share"] - r["share"] <= head["noise"] + r["noise"] + 1e-6, (head, r)
    for hotter, cooler in zip(groups, groups[1:]):
        assert min(r["share"] for r in hotter) >= max(r["share"] for r in cooler), (hotter, cooler)


def test_regions_group_anchor_epilogues_and_attention_without_torch():
    nodes = [
        {"name": "mm", "op": "mm", "kind": "anchor", "args": ["x", "w"], "users": ["relu"], "time_us": 60},
        {"name": "relu", "op": "relu", "kind": "elementwise", "args": ["mm"], "users": ["bmm"], "time_us": 5},
        {"name": "bmm", "op": "bmm", "kind": "anchor", "args": ["relu", "k"], "users": ["div"], "time_us": 20},
        {"name": "div", "op": "div", "kind": "elementwise", "args": ["bmm"], "users": ["softmax"], "time_us": 2},
        {"name": "softmax", "op": "_softmax", "kind": "norm", "args": ["div"], "users": ["bmm_1"], "time_us": 3},
        {"name": "bmm_1", "op": "bmm", "kind": "anchor", "args": ["softmax", "v"], "users": ["output"], "time_us": 10},
    ]
    regions = group(nodes)
    assert [r["ops"] for r in regions] == [["mm", "relu"], ["bmm", "div", "_softmax", "bmm"]]
    assert regions[0]["kind"] == "gemm+epilogue" and regions[1]["kind"] == "attention"
    assert regions[0]["share"] == pytest.approx(0.65) and regions[0]["amdahl_bound"] == pytest.approx(1 / 0.35, rel=1e-3)
    assert regions[1]["inputs"] == ["relu", "k", "v"]
    # a node that changes model state is never extracted
    nodes[1]["mutates"] = True
    assert not group(nodes)[0]["extractable"] or group(nodes)[0]["ops"] != ["mm", "relu"]


def test_plan_of_a_transformer_block_finds_and_extracts_its_regions(block_plan):
    plan, out = block_plan
    kinds = {r["kind"] for r in plan["regions"]}
    assert {"gemm+epilogue", "attention", "norm"} <= kinds, kinds
    assert_ranked_within_the_noise(plan["regions"])
    assert 0 < sum(r["share"] for r in plan["regions"]) <= 1.0001
    assert region(plan, ["linear", "add"])["inputs"][1:3] == ["p_fc2_weight", "p_fc2_bias"]
    assert all(r["extractable"] and Path(r["problem"]).is_file() for r in plan["regions"])
    assert (out / "plan.json").is_file() and "amdahl" in render(plan)


def test_every_extracted_region_is_a_problem_its_own_reference_passes(block_plan, evaluator):
    plan, _ = block_plan
    for r in plan["regions"]:
        source = Path(r["problem"]).read_text()
        result = evaluator.evaluate(r["problem"], source.replace("class Model(", "class ModelNew("), NO_DEFENCES)
        assert result.status == Status.CORRECT, (r["id"], r["ops"], result.reason, result.log[-800:])


@pytest.mark.parametrize("name,expect", [("1_MLP.py", "gemm+epilogue"), ("4_LeNet5.py", "conv+epilogue"),
                                         ("43_MinGPTCausalAttention.py", "gemm"),
                                         ("44_MiniGPTBlock.py", "attention")])
def test_plan_on_kernelbench_level3_models(name, expect, tmp_path, evaluator):
    path = KB3 / name
    if not path.is_file():
        pytest.skip(f"KernelBench is not at {KB3}")
    plan = make_plan(path, tmp_path, device="cpu")
    assert plan["smoke_overrides"], "CPU plans run at derived smoke sizes"
    assert any(r["kind"].startswith(expect) for r in plan["regions"]), [r["kind"] for r in plan["regions"]]
    extracted = [r for r in plan["regions"] if r["extractable"]]
    assert len(extracted) >= 2
    # what the extraction writes must run (an H100 run found `-inf` written without `inf` defined)
    assert not [r["why_not"] for r in plan["regions"] if "does not run" in (r["why_not"] or "")]
    for r in extracted[:3]:
        source = Path(r["problem"]).read_text()
        result = evaluator.evaluate(r["problem"], source.replace("class Model(", "class ModelNew("), NO_DEFENCES)
        assert result.status == Status.CORRECT, (name, r["ops"], result.reason)


def test_a_file_that_is_not_a_model_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                   "        return x * 2 if x.sum() > 0 else x\n\ndef get_inputs():\n    return [torch.randn(4)]\n\n"
                   "def get_init_inputs():\n    return []\n")
    with pytest.raises(PlanError) as caught:  # data-dependent control flow: torch.export cannot capture it
        make_plan(bad, tmp_path / "out", device="cpu")
    assert "\n" not in str(caught.value) and str(caught.value)


# == optimise, splice, verify: a scripted model ===============================================
class RegionModel:
    """Answers each region's task with the kernel written for its ops (a wrong one for the rest)."""

    name = "scripted-regions"

    def __init__(self):
        self.calls = []

    def query(self, messages, tools=None):
        task = messages[1]["content"]
        self.calls.append(task.splitlines()[0])
        if "(layer_norm)." in task:
            code = LN_KERNEL
        elif "(linear, add)." in task:
            code = LINEAR_ADD_KERNEL
        else:
            code = LINEAR_ADD_KERNEL.replace("acc + bias[None, :] + res", "acc * 2.0")  # wrong, on purpose
        return ModelReply(content=f"```python\n{code}```", cost_known=True)


def test_two_region_kernels_are_spliced_and_the_model_passes_end_to_end(block_plan, evaluator, tmp_path):
    from kernelagent.orchestrate.whole_model import optimize_whole_model

    plan, _ = block_plan
    first = [region(plan, ["layer_norm"]), region(plan, ["linear", "add"]), region(plan, ["linear", "gelu"])]
    ordered = {**plan, "regions": first + [r for r in plan["regions"] if r not in first]}
    model, budget = RegionModel(), Budget(max_turns=4)
    summary = optimize_whole_model(HERE / "block.py", model, out=tmp_path / "run", evaluator=evaluator,
                                   budget=budget, device="cpu", top=3, min_share=0.0, trials=2, mode="text",
                                   plan_data=ordered)
    assert budget.turns == 4 and len(model.calls) == 4  # one budget for every region
    rows = {r["region"]: r for r in summary["regions"]}
    ln, la, gelu = (rows[r["id"]] for r in first)
    assert ln["status"] == "spliced" and la["status"] == "spliced", summary["regions"]
    assert gelu["status"] == "no kernel" and "no verified kernel" in gelu["why"]
    assert summary["passed"] and summary["verdict"] == "correct" and sorted(summary["spliced"]) == sorted(
        [first[0]["id"], first[1]["id"]])
    spliced = Path(summary["model_optimized"]).read_text()
    assert "kernelagent" not in [line.split()[1] for line in spliced.splitlines()
                                 if line.startswith(("import ", "from "))]
    assert (tmp_path / "run" / "summary.json").is_file() and 'id="regions"' in (tmp_path / "run" / "report.html").read_text()


def test_a_region_kernel_that_breaks_the_model_is_left_out_with_its_reason(block_plan, evaluator, tmp_path,
                                                                         monkeypatch):
    """A kernel verified on its region but wrong in the model (here: handed over as verified, as
    the agent would after a region-level pass) is caught by the end-to-end check and left out."""
    from types import SimpleNamespace

    import kernelagent.orchestrate.run as run_module
    from kernelagent.orchestrate.whole_model import optimize_whole_model

    plan, _ = block_plan
    ln = region(plan, ["layer_norm"])
    wrong = LN_KERNEL.replace("d / tl.sqrt(var + eps) * w + b", "d / tl.sqrt(var + eps) * w + b + 1.0")

    def fake_optimize(problem, model, *, out, **kw):
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "kernel.py").write_text(wrong)
        best = SimpleNamespace(passed=True, code=wrong)
        result = SimpleNamespace(best=best, outcome="success", stop_reason="target_met", stop_detail="")
        return SimpleNamespace(result=result, summary={"best": {}, "stop_detail": ""})

    monkeypatch.setattr(run_module, "optimize", fake_optimize)
    summary = optimize_whole_model(HERE / "block.py", None, out=tmp_path / "run", evaluator=evaluator,
                                   budget=Budget(max_turns=2), device="cpu", top=1, min_share=0.0, trials=2,
                                   plan_data={**plan, "regions": [ln] + [r for r in plan["regions"] if r is not ln]})
    row = next(r for r in summary["regions"] if r["region"] == ln["id"])
    assert row["status"] == "left out" and "spliced alone, the model is incorrect" in row["why"], row
    assert summary["spliced"] == [] and summary["passed"]  # the original model, unchanged, still passes


def test_plan_cli_prints_the_table_and_writes_the_plan(tmp_path):
    from typer.testing import CliRunner

    from kernelagent.cli import app

    result = CliRunner().invoke(app, ["plan", str(HERE / "block.py"), "--device", "cpu", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "region_0" in result.output and "amdahl" in result.output
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["regions"] and (tmp_path / "regions" / "region_0.py").is_file()
    missing = CliRunner().invoke(app, ["plan", str(tmp_path / "nope.py")])
    assert missing.exit_code == 2 and "not found" in missing.stderr


def test_optimize_whole_model_from_the_cli_through_litellm(tmp_path, monkeypatch):
    """`kernelagent optimize model.py --whole-model` end to end through the real litellm client (the
    fake OpenAI server): the plan, the agent on the hottest region within the turn budget, the
    end-to-end check. The scripted replies hold no kernel, so nothing is spliced: exit 1, and the
    unchanged model still passes end to end. (tests/test_wholemodel_cli.py runs the block's small
    sibling, tiny.py, through progress, Ctrl-C and --resume.)"""
    from typer.testing import CliRunner

    from kernelagent.cli import app
    from tests.fake_openai_server import FakeOpenAIServer, text

    env = {"CUDA_VISIBLE_DEVICES": "", "KERNELAGENT_MODEL": None, "KERNELAGENT_API_BASE": None,
           "KERNELAGENT_API_KEY": None, "KERNELAGENT_CACHE_DIR": str(tmp_path / "cache")}
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    with FakeOpenAIServer() as server:
        server.add(text("I would need to think about this region."), text("Still thinking."))
        result = CliRunner().invoke(app, ["optimize", str(HERE / "tiny.py"), "--whole-model", "--regions", "1",
                                          "--model", "openai/fake", "--api-base", server.url, "--max-turns", "2",
                                          "--device", "cpu", "--mode", "text", "--out", "run", "--no-live"],
                                    env=env)
        calls = len(server.requests)
    assert result.exit_code == 1, result.output
    assert calls == 2 and "whole model: correct; regions spliced: none" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kind"] == "whole_model" and summary["budget"]["turns"] == 2
    assert summary["exit_code"] == result.exit_code == 1  # issue 56: the summary says it, as optimize's does
    # issue 56: the last line's paths are all as given (here relative), no region's line reads as the
    # command's end, and the report's "judge again" command names the problem as given
    last = result.stdout.strip().splitlines()[-1]
    assert "model: run/model_optimized.py; report: run/report.html; summary: run/summary.json" in last, last
    assert "(exit " not in result.stderr and "region's agent run: no_correct_kernel" in result.stderr
    assert f"kernelagent eval {HERE / 'tiny.py'} " in (out / "report.html").read_text()
    attempted = [r for r in summary["regions"] if r["status"] == "no kernel"]
    assert len(attempted) == 1 and "no verified kernel" in attempted[0]["why"]
    assert (out / "model_optimized.py").is_file() and (out / "plan" / "plan.json").is_file()


# == plan on the CPU, bad input (issue 43) ======================================================
def test_plan_cli_bad_input_is_one_line_naming_the_file(tmp_path):
    from typer.testing import CliRunner

    from kernelagent.cli import app

    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    onfile = CliRunner().invoke(app, ["plan", str(HERE / "tiny.py"), "--out", str(afile)])
    assert onfile.exit_code == 2, onfile.output  # was 70, an internal error
    assert onfile.stderr.strip() == f"error: --out {afile}: {afile} is a file, not a folder"
    raising = tmp_path / "raises.py"
    raising.write_text("import torch\nraise RuntimeError('boom at import')\nclass Model(torch.nn.Module):\n"
                       "    pass\n\ndef get_inputs():\n    return []\n\ndef get_init_inputs():\n    return []\n")
    result = CliRunner().invoke(app, ["plan", str(raising), "--device", "cpu", "--out", str(tmp_path / "p")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: {raising}: importing it raised RuntimeError: boom at import"], lines


def test_plan_says_when_the_regions_and_the_forward_disagree(tmp_path, monkeypatch):
    """A CPU plan whose regions summed to 3534% of the model's forward was printed without a word."""
    from typer.testing import CliRunner

    import kernelagent.wholemodel.plan as plan_module
    from kernelagent.cli import app

    def fake(problem, out, device="cpu", **kw):
        return {"device": "cpu", "regions": [], "totals": {
            "nodes_us": 3534.1, "model_forward_us": 100.0, "nodes_vs_model": 35.341, "clock": "CPU time"}}

    monkeypatch.setattr(plan_module, "make_plan", fake)
    result = CliRunner().invoke(app, ["plan", str(HERE / "tiny.py"), "--device", "cpu", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("warning: the regions sum to 3534% of the model's own forward"), result.stderr
    assert "rough guide" in result.stderr and "(3534.1%)" in result.stdout


def test_cpu_node_times_are_the_median_round_less_the_clocks_own_cost():
    """One slow repetition (another process took the CPU) must not move a node up the ranking; the
    clock's own cost per span is taken out (issue 56: medians of interleaved rounds, timing.py)."""
    from kernelagent.wholemodel.timing import ROUNDS, summarise

    linear = [14.0, 15.0, 14.5, 400.0, 14.2, 14.0, 14.1, 14.3, 14.6][:ROUNDS]
    rounds = [{"linear": t, "relu": 6.2} for t in linear]
    out = summarise(rounds, [30.0] * ROUNDS, [25.0] * ROUNDS, overhead=4.2)["per_node"]
    assert out["linear"]["time_us"] == pytest.approx(10.1, abs=0.05)
    assert out["relu"]["time_us"] == pytest.approx(2.0, abs=0.05)
