"""--inductor-modes (issue 13, scope 4): one option shared by eval, bench, optimize, verify and
profile; mapped to EvalConfig.compile_modes; unknown modes are bad input (exit 2, one line); the
baseline cache key and the bench run id follow the modes; results state that TF32 is off."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kernelagent.cli import app
from kernelagent.cli.core import inductor_modes
from kernelagent.errors import UserError
from kernelagent.harness import EvalConfig, EvalResult
from kernelagent.harness.caller.baseline_cache import BaselineCache
from kernelagent.harness.config import INDUCTOR_MODES, baseline_name
from tests.conftest import BENCHMARKS

RELU = BENCHMARKS / "level1" / "1_relu.py"
RELU_SOL = BENCHMARKS / "solutions" / "level1" / "1_relu.py"


def test_parse_modes_default_first_alias_and_errors():
    assert inductor_modes(None) == ("default",)
    assert inductor_modes(None, max_autotune=True) == ("default", "max-autotune-no-cudagraphs")
    assert inductor_modes("reduce-overhead, max-autotune-no-cudagraphs") == \
        ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
    assert inductor_modes("default,reduce-overhead", max_autotune=True) == \
        ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
    assert inductor_modes("max-autotune,max-autotune") == ("default", "max-autotune")
    with pytest.raises(UserError, match="unknown mode 'fast'"):
        inductor_modes("default,fast")
    with pytest.raises(UserError, match="empty"):
        inductor_modes(" , ")
    assert baseline_name("default") == "compile" and baseline_name("reduce-overhead") == "compile:reduce-overhead"
    assert set(INDUCTOR_MODES) >= {"default", "max-autotune-no-cudagraphs", "reduce-overhead"}


@pytest.mark.parametrize("argv", [
    ["eval", str(RELU), str(RELU_SOL)],
    ["bench", str(BENCHMARKS), "--candidates", str(BENCHMARKS / "solutions")],
    ["optimize", str(RELU), "--model", "openai/x"],
    ["verify"],
    ["profile", str(RELU), str(RELU_SOL)],
])
def test_unknown_mode_is_bad_input_on_every_command(argv):
    result = CliRunner().invoke(app, argv + ["--inductor-modes", "default,turbo"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == ["error: --inductor-modes: unknown mode 'turbo' (use " + ", ".join(INDUCTOR_MODES) + ")"]


def test_eval_maps_the_option_to_compile_modes(eval_configs):
    seen = eval_configs
    runner = CliRunner()
    assert runner.invoke(app, ["eval", str(RELU), str(RELU_SOL), "--device", "cpu", "--json",
                               "--inductor-modes", "reduce-overhead"]).exit_code == 0
    assert runner.invoke(app, ["eval", str(RELU), str(RELU_SOL), "--device", "cpu", "--json",
                               "--max-autotune"]).exit_code == 0
    assert [c.compile_modes for c in seen] == [("default", "reduce-overhead"),
                                               ("default", "max-autotune-no-cudagraphs")]


def test_config_validates_and_round_trips_modes_and_cache_key_follows_them():
    config = EvalConfig(compile_modes=["default", "reduce-overhead"])
    assert config.compile_modes == ("default", "reduce-overhead")
    assert EvalConfig.from_dict(config.to_dict()).compile_modes == config.compile_modes
    with pytest.raises(ValueError, match="unknown Inductor mode"):
        EvalConfig(compile_modes=("default", "fastest"))
    cache = BaselineCache("/nonexistent")
    fp = {"gpu_name": "NVIDIA H100 80GB HBM3", "driver": "580", "torch": "2.11", "triton": "3.6", "python": "3.12"}
    keys = {cache.key("sha", fp, EvalConfig(compile_modes=m))
            for m in (("default",), ("default", "reduce-overhead"), ("default", "max-autotune-no-cudagraphs"))}
    assert len(keys) == 3
    # the order the modes were given in does not split the cache
    assert cache.key("sha", fp, EvalConfig(compile_modes=("default", "reduce-overhead", "max-autotune"))) == \
        cache.key("sha", fp, EvalConfig(compile_modes=("default", "max-autotune", "reduce-overhead")))


def test_bench_spec_modes_and_stable_run_ids():
    from kernelagent.bench import BenchSpec

    plain = BenchSpec(root=str(BENCHMARKS))
    assert "inductor_modes" not in plain.identity()  # runs started before the option keep their ids
    assert plain.eval_config().compile_modes == ("default",)
    alias = BenchSpec(root=str(BENCHMARKS), max_autotune=True)
    assert alias.eval_config().compile_modes == ("default", "max-autotune-no-cudagraphs")
    extra = BenchSpec(root=str(BENCHMARKS), inductor_modes=["default", "reduce-overhead"])
    assert extra.eval_config().compile_modes == ("default", "reduce-overhead")
    assert len({plain.run_id(), alias.run_id(), extra.run_id()}) == 3


def test_verify_config_carries_modes():
    from types import SimpleNamespace

    from kernelagent.ci.verify import eval_config

    config = eval_config(SimpleNamespace(trials=3), SimpleNamespace(backend="triton"), cpu=False,
                         compile_modes=("default", "reduce-overhead"))
    assert config.compile_modes == ("default", "reduce-overhead") and config.timing and config.trials == 3
    assert eval_config(SimpleNamespace(trials=3), SimpleNamespace(backend="triton"), cpu=False).compile_modes == \
        ("default",)


def test_result_states_tf32_off_and_round_trips():
    result = EvalResult(status="correct")
    data = result.to_dict()
    assert data["numerics"]["tf32"] is False and "TF32 is off in every baseline" in data["numerics"]["note"]
    assert EvalResult.from_dict(data).numerics == result.numerics
    old = {k: v for k, v in data.items() if k != "numerics"}  # a stored result from before the field
    assert EvalResult.from_dict(old).numerics["tf32"] is False
