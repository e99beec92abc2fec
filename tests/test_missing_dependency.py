"""Problems that import packages this machine lacks (KernelBench's level3/48 and 49 import
einops; level 4 imports transformers): `eval` says which package in one line and exits 2,
`bench` marks the problem skipped, leaves it out of the rates and lists it; level 4 runs only
when --levels asks for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelagent.bench.discover import discover
from kernelagent.cli import app
from kernelagent.problem import MissingDependencyError, imported_modules, load_problem, missing_dependency
from tests.conftest import CANDIDATES, TESTS

NO_SUCH = "kernelagent_test_no_such_package"
KB = TESTS.parents[1] / "shared" / "kernelbench" / "KernelBench"
RELU = (TESTS / "kernelbench_layout" / "level1" / "19_ReLU.py").read_text()


def needs(package: str, relu: str = RELU) -> str:
    """The ReLU problem with one more import."""
    return f"import {package}\n" + relu


def test_missing_package_is_named(tmp_path):
    path = tmp_path / "p.py"
    path.write_text(needs(f"{NO_SUCH}.sub as x"))
    with pytest.raises(MissingDependencyError, match=NO_SUCH) as info:
        load_problem(path)
    assert info.value.package == NO_SUCH and "\n" not in str(info.value)
    assert load_problem(path, check_dependencies=False).name == "p"  # the caller may ask on its own


def test_guarded_and_installed_imports_are_fine(tmp_path):
    path = tmp_path / "p.py"
    path.write_text(f"try:\n    import {NO_SUCH}\nexcept ImportError:\n    {NO_SUCH} = None\n"
                    "from __future__ import annotations\nimport os.path\n" + RELU)
    load_problem(path)
    import ast

    tree = ast.parse(path.read_text())
    assert NO_SUCH not in imported_modules(tree) and "os" in imported_modules(tree)
    assert missing_dependency(tree) is None
    # Inside a function it still counts: the problem would fail when it runs.
    tree = ast.parse(f"def get_inputs():\n    from {NO_SUCH} import x\n    return []\n")
    assert missing_dependency(tree) == NO_SUCH


def test_eval_says_which_package_and_exits_2(tmp_path):
    path = tmp_path / "p.py"
    path.write_text(needs(NO_SUCH))
    result = CliRunner().invoke(app, ["eval", str(path), str(CANDIDATES / "relu_good.py"), "--device", "cpu"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and NO_SUCH in lines[0] and "not installed" in lines[0] and "Traceback" not in lines[0]


@pytest.mark.skipif(not (KB / "level3").is_dir(), reason="KernelBench is not in ../shared")
def test_kernelbench_einops_problems():
    import importlib.util

    if importlib.util.find_spec("einops") is not None:
        pytest.skip("einops is installed here")
    for name in ("48_Mamba2ReturnY.py", "49_Mamba2ReturnFinalState.py"):
        with pytest.raises(MissingDependencyError, match="'einops'"):
            load_problem(KB / "level3" / name)


def _layout(tmp_path: Path) -> Path:
    root = tmp_path / "kb"
    for level, name, text in (("level1", "19_ReLU", RELU), ("level3", "48_needs_pkg", needs(NO_SUCH)),
                              ("level4", "1_hub_model", needs(NO_SUCH))):
        (root / level).mkdir(parents=True, exist_ok=True)
        (root / level / f"{name}.py").write_text(text)
    return root


def test_level_4_only_when_asked(tmp_path):
    root = _layout(tmp_path)
    assert [r.key for r in discover(root)] == ["level1/19_ReLU", "level3/48_needs_pkg"]
    assert [r.key for r in discover(root, levels="4")] == ["level4/1_hub_model"]
    assert [r.key for r in discover(root, levels="1,4")] == ["level1/19_ReLU", "level4/1_hub_model"]


def test_bench_skips_and_lists_missing_dependencies(tmp_path, monkeypatch):
    root = _layout(tmp_path)
    cdir = tmp_path / "cands"
    (cdir / "level3").mkdir(parents=True)
    (cdir / "level3" / "48_needs_pkg.py").write_text((CANDIDATES / "relu_good.py").read_text())
    # level1/19_ReLU has no candidate (missing: counted, failed); level3/48 is skipped (not counted).
    args = ["bench", str(root), "--candidates", str(cdir), "--levels", "1,3", "--gpus", "cpu",
            "--store", str(tmp_path / "s.sqlite"), "--out", str(tmp_path / "run"), "--no-live"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"skipped level3/48_needs_pkg: missing dependency {NO_SUCH}" in result.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    m = summary["metrics"]
    assert m["problems"] == 1 and m["correct"] == 0 and m["correctness_rate"] == 0.0
    assert m["skipped"] == [{"key": "level3/48_needs_pkg", "reason": f"missing dependency {NO_SUCH}"}]
    assert m["status_counts"] == {"missing": 1, "skipped": 1}
    assert m["by_level"]["level3"]["problems"] == 0
    record = next(r for r in summary["problems"] if r["key"] == "level3/48_needs_pkg")
    assert record["status"] == "skipped" and record["reason"] == f"skipped: missing dependency {NO_SUCH}"
    html = (tmp_path / "run" / "report.html").read_text()
    assert 'id="skipped"' in html and f"missing dependency {NO_SUCH}" in html
    assert "skipped" in (tmp_path / "run" / "problems.csv").read_text()
    # Installing the package and running the same command again evaluates the problem (its
    # file unchanged, so only the fresh dependency check can bring it back).
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / f"{NO_SUCH}.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'site'}:{TESTS.parent}")
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["metrics"]["problems"] == 2 and summary["metrics"]["skipped"] == []
    record = next(r for r in summary["problems"] if r["key"] == "level3/48_needs_pkg")
    assert record["status"] != "skipped" and record["samples"] == 1
