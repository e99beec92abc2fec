"""`kernelagent dataset prompts`: one chat prompt per problem, and a split that never puts a
test problem into training."""

from __future__ import annotations

import json
import shutil

from typer.testing import CliRunner

from kernelagent.cli import app
from kernelagent.rl.dataset import assign_splits, build_rows, find_problems, read_jsonl
from kernelagent.rl.problems import problem_id_for
from tests.conftest import BENCHMARKS, read


def benchmark_problems() -> dict[str, str]:
    return {problem_id_for(p, BENCHMARKS): read(p) for p in find_problems(BENCHMARKS)}


def test_find_problems_skips_solutions():
    ids = set(benchmark_problems())
    assert "level1/1_relu" in ids and "level3/1_mlp_gelu" in ids
    assert not any(i.startswith("solutions") for i in ids)


def test_split_never_leaks_and_is_stable():
    problems = benchmark_problems()
    for seed in range(25):
        sides = assign_splits(problems, 0.8, seed)
        train = {p for p, s in sides.items() if s == "train"}
        test = {p for p, s in sides.items() if s == "test"}
        assert train.isdisjoint(test) and train | test == set(problems)
        assert assign_splits(problems, 0.8, seed) == sides  # deterministic
        # removing problems never moves another one across the split
        fewer = {p: src for i, (p, src) in enumerate(sorted(problems.items())) if i % 3}
        assert all(sides[p] == s for p, s in assign_splits(fewer, 0.8, seed).items())
    assert assign_splits(problems, 0.8, 0) != assign_splits(problems, 0.8, 1)
    shares = [sum(s == "train" for s in assign_splits(problems, 0.8, seed).values()) / len(problems)
              for seed in range(25)]
    assert 0.7 < sum(shares) / len(shares) < 0.9
    assert set(assign_splits(problems, 1.0, 0).values()) == {"train"}
    assert set(assign_splits(problems, 0.0, 0).values()) == {"test"}


def test_copies_of_a_problem_go_to_the_same_side():
    src = read(BENCHMARKS / "level1" / "1_relu.py")
    problems = {f"copy{i}": src for i in range(40)} | {"other": "x = 1\n"}
    sides = assign_splits(problems, 0.5, 3)
    assert len({sides[f"copy{i}"] for i in range(40)}) == 1


def test_rows_and_cli_split(tmp_path):
    folder = tmp_path / "problems"
    for rel in ("level1/1_relu.py", "level1/5_softmax.py", "level2/1_linear_bias_gelu.py",
                "level3/1_mlp_gelu.py", "level1/2_gelu.py"):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(BENCHMARKS / rel, folder / rel)
    (folder / "solutions").mkdir()
    shutil.copy(BENCHMARKS / "solutions/level1/1_relu.py", folder / "solutions/1_relu.py")

    out = tmp_path / "out" / "prompts.jsonl"
    result = CliRunner().invoke(app, ["dataset", "prompts", str(folder), "--out", str(out), "--split", "0.6",
                                      "--seed", "7", "--no-inputs", "--gpu", "NVIDIA H200"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = read_jsonl(out)
    train, test = read_jsonl(out.with_name("prompts.train.jsonl")), read_jsonl(out.with_name("prompts.test.jsonl"))
    assert [r["problem_id"] for r in rows] == sorted(r["problem_id"] for r in rows)
    assert len(rows) == 5 and len(train) + len(test) == 5
    assert {r["problem_id"] for r in train}.isdisjoint({r["problem_id"] for r in test})
    assert f"train {len(train)}, test {len(test)}, seed 7" in result.output
    row = rows[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["problem_source"] == read(BENCHMARKS / f"{row['problem_id']}.py")
    assert row["problem_source"].strip() in row["prompt"][1]["content"]
    assert "NVIDIA H200" in row["prompt"][1]["content"] and "```python" in row["prompt"][0]["content"]
    # the same again: byte for byte
    again = tmp_path / "again.jsonl"
    CliRunner().invoke(app, ["dataset", "prompts", str(folder), "--out", str(again), "--split", "0.6",
                             "--seed", "7", "--no-inputs", "--gpu", "NVIDIA H200"])
    assert again.read_text() == out.read_text()
    bad = CliRunner().invoke(app, ["dataset", "prompts", str(tmp_path / "none"), "--out", str(tmp_path / "x.jsonl")])
    assert bad.exit_code == 2 and "not found" in bad.output


def test_rows_describe_inputs_like_optimize(tmp_path):
    rows = build_rows(BENCHMARKS / "level1" / "1_relu.py", gpu="cpu", split=None)
    assert len(rows) == 1 and "split" not in rows[0]
    task = rows[0]["prompt"][1]["content"]
    assert "Tensor(shape=(4096, 16384), dtype=float32)" in task and "Triton interpreter" in task
    json.dumps(rows)  # plain JSON


KERNELBENCH = __import__("pathlib").Path(__file__).resolve().parents[2] / "shared" / "kernelbench" / "KernelBench"


@__import__("pytest").mark.parametrize("folder", ["benchmarks", "benchmarks/level1", "kernelbench"])
def test_ids_and_split_agree_across_dataset_bench_and_sft(tmp_path, folder):
    """The id and side of a problem are the same in `dataset prompts`, `bench` (its
    discovery and record keys) and `export sft`, whatever folder they were given."""
    import pytest

    from kernelagent.bench.discover import discover, problem_split
    from kernelagent.rl.sft import row_from_run

    root = KERNELBENCH if folder == "kernelbench" else BENCHMARKS.parent / folder
    if not root.is_dir():
        pytest.skip(f"no KernelBench checkout at {root} (expected beside the repository)")
    out = tmp_path / "p.jsonl"
    result = CliRunner().invoke(app, ["dataset", "prompts", str(root), "--out", str(out), "--no-inputs",
                                      "--gpu", "cpu"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = {r["problem_id"]: r for r in read_jsonl(out)}
    bench = {ref.key: ref for ref in discover(root)}
    assert set(rows) == set(bench) and len(rows) > 10
    assert all(k.startswith("level") and "/" in k for k in rows)  # never KernelBench/level1/...
    assert all(not k.startswith(("solutions", "src")) for k in rows)
    full = {r["problem_id"]: r for r in build_rows(BENCHMARKS if folder != "kernelbench" else root,
                                                   inspect_inputs=False, gpu="cpu")}
    for pid, row in rows.items():
        assert full[pid]["split"] == row["split"]  # the same side from the parent folder
        assert row["split"] == problem_split(row["problem_sha256"])
    # an exported run of a few of these problems carries the same id and split
    for pid in sorted(rows)[:3]:
        run = tmp_path / "runs" / pid.replace("/", "_")
        run.mkdir(parents=True)
        (run / "kernel.py").write_text("k")
        summary = {"best": {"verdict": "correct"}, "model": "m",
                   "problem": {"name": pid.split("/")[-1], "path": str(bench[pid].path),
                               "sha256": rows[pid]["problem_sha256"]}}
        (run / "summary.json").write_text(json.dumps(summary))
        (run / "trajectory.json").write_text(json.dumps({"final_verification": [{"passed": True}], "config": {"mode": "text"},
                                                         "messages": [{"role": "system", "content": "s"},
                                                                      {"role": "user", "content": "u"},
                                                                      {"role": "assistant", "content": "k"}]}))
        row, why = row_from_run(run, 0.0)
        assert why == "" and (row["problem_id"], row["split"]) == (pid, rows[pid]["split"])
