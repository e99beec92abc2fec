"""Issue 54, class 3: the comparison's relative L2 rule follows the reference's own rounding,
measured against the reference run once more in float64 (child/precise.py, child/compare.py), and
every dtype is compared in full, complex included. Rows of docs/concepts/defences.md (row 14b-14d).

Each row builds a real reference module, runs it (the reference), its float64 copy (precise.py),
and a candidate computed another way, then compares as the reference process does."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn as nn

from kernelagent.harness.child import compare, precise
from kernelagent.harness.child.compare import compare_outputs
from tests.conftest import TESTS

# Where test_kernelbench_solutions.py finds KernelBench (../shared), or ./shared in a checkout.
KB = next((root / "shared" / "kernelbench" / "KernelBench" for root in (TESTS.parents[1], TESTS.parent)
           if (root / "shared" / "kernelbench" / "KernelBench").is_dir()), TESTS.parents[1] / "shared")
CPU = torch.device("cpu")


def received(t: torch.Tensor) -> dict:
    return {"tensor": t, "shape": tuple(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "device": "cpu"}


def judge(model: nn.Module, inputs: list, candidate) -> tuple[compare.Comparison, torch.Tensor]:
    """As reference_side.check: float64 copies first, then the reference, the float64 run, the comparison."""
    high = precise.HighPrecision(model, CPU)
    wide = high.copies(inputs)
    with torch.no_grad():
        reference = model(*[x.clone() for x in inputs])
        out = candidate(model, *[x.clone() for x in inputs])
    run = high.run(wide, [reference], regenerate=lambda: [x.clone() for x in inputs])
    return compare_outputs([reference], [received(out)], None, None, run), out


# --- the references -------------------------------------------------------------------------

class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class Matmul(nn.Module):
    def forward(self, a, b):
        return a @ b


class Rfft(nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x, dim=-1)


class Linear(nn.Module):
    def __init__(self, k: int, n: int, dtype: torch.dtype):
        super().__init__()
        self.linear = nn.Linear(k, n).to(dtype)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x))


class LayerNorm(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.norm = nn.LayerNorm(n)

    def forward(self, x):
        return self.norm(x)


class Cumsum(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=-1)


# --- the candidates ---------------------------------------------------------------------------

def softmax_without_last_block(model, x, block=1024):
    """The row's max and sum leave out its last block (rows sum to about 1.008)."""
    head = x[..., :-block]
    m = head.max(dim=-1, keepdim=True).values
    return torch.exp(x - m) / torch.exp(head - m).sum(dim=-1, keepdim=True)


def softmax_blocked(model, x, block=1024):
    """Honest: an online softmax over blocks, in the reference's dtype."""
    m = torch.full(x.shape[:-1] + (1,), float("-inf"), dtype=torch.float32)
    s = torch.zeros_like(m)
    xf = x.float()
    for start in range(0, x.shape[-1], block):
        part = xf[..., start:start + block]
        new_m = torch.maximum(m, part.max(dim=-1, keepdim=True).values)
        s = s * torch.exp(m - new_m) + torch.exp(part - new_m).sum(dim=-1, keepdim=True)
        m = new_m
    return (torch.exp(xf - m) / s).to(x.dtype)


def gemm_on_bf16_operands(model, a, b):
    return (a.bfloat16().float() @ b.bfloat16().float())


def gemm_k_blocked(model, a, b, block=32):
    """Honest: a K loop of blocks, as a Triton kernel's accumulator (fp32 accumulation)."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32)
    for k in range(0, a.shape[1], block):
        acc = acc + a[:, k:k + block].float() @ b[k:k + block].float()
    return acc.to(a.dtype)


def rfft_real_part_only(model, x):
    ref = torch.fft.rfft(x, dim=-1)
    return torch.complex(ref.real, torch.zeros_like(ref.real))


def rfft_by_dft_matrix(model, x):
    """Honest: the DFT as a matmul with cos/sin tables (fp32)."""
    n = x.shape[-1]
    k = torch.arange(n // 2 + 1, dtype=torch.float64)[:, None]
    t = torch.arange(n, dtype=torch.float64)[None, :]
    angle = 2 * torch.pi * k * t / n
    real = x @ torch.cos(angle).float().t()
    imag = -(x @ torch.sin(angle).float().t())
    return torch.complex(real, imag)


def linear_gelu_fp32_accumulate(model, x):
    """Honest for fp16/bf16: fp32 accumulation and activation, one rounding at the end."""
    w, b = model.linear.weight.float(), model.linear.bias.float()
    return torch.nn.functional.gelu(x.float() @ w.t() + b).to(x.dtype)


def layernorm_one_pass(model, x):
    """Honest: mean and E[x^2] in one pass (fp32)."""
    mean = x.mean(dim=-1, keepdim=True)
    var = (x * x).mean(dim=-1, keepdim=True) - mean * mean
    return (x - mean) / torch.sqrt(var + model.norm.eps) * model.norm.weight + model.norm.bias


def cumsum_sequential_blocks(model, x, block=128):
    out = torch.empty_like(x)
    carry = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for start in range(0, x.shape[-1], block):
        part = torch.cumsum(x[..., start:start + block], dim=-1) + carry[..., None]
        out[..., start:start + block] = part
        carry = part[..., -1]
    return out


def _seeded(seed: int):
    torch.manual_seed(seed)


class RMSNormBf16(nn.Module):
    """The usual pattern: the norm computed in fp32 inside a bf16 model, cast back."""
    def __init__(self, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(n).bfloat16() + 0.5)

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.weight


def rmsnorm_bf16_math(model, x):
    """Honest: the norm in fp32 with another reduction order, one rounding at the end."""
    xf = x.float()
    ms = (xf * xf).sum(-1, keepdim=True) / x.shape[-1]
    return (xf / torch.sqrt(ms + 1e-6) * model.weight.float()).to(x.dtype)


# (name, reference dtype, reference, inputs, candidate, passes): each wrong row passed the
# comparison before issue 54's fix (a flat 1% floor on relative L2, complex outputs' real part).
ROWS = [
    ("vocab softmax missing its last block", "float32", Softmax, lambda: [torch.randn(2, 131072)],
     softmax_without_last_block, False),
    ("fp32 GEMM on bf16-rounded operands, outputs below atol", "float32", Matmul,
     lambda: [torch.randn(64, 512) * 3e-3, torch.randn(512, 64) * 3e-3], gemm_on_bf16_operands, False),
    ("rfft with every imaginary part zero", "complex64", Rfft, lambda: [torch.randn(4, 1000)],
     rfft_real_part_only, False),
    ("honest vocab softmax (online, blocked)", "float32", Softmax, lambda: [torch.randn(2, 131072)],
     softmax_blocked, True),
    ("honest bf16 softmax", "bfloat16", Softmax, lambda: [torch.randn(4, 50000).bfloat16()], softmax_blocked, True),
    ("honest fp32 GEMM, outputs below atol", "float32", Matmul,
     lambda: [torch.randn(64, 512) * 3e-3, torch.randn(512, 64) * 3e-3], gemm_k_blocked, True),
    ("honest fp16 linear + GELU", "float16", lambda: Linear(512, 256, torch.float16),
     lambda: [torch.randn(32, 512).half()], linear_gelu_fp32_accumulate, True),
    ("honest bf16 linear + GELU", "bfloat16", lambda: Linear(512, 256, torch.bfloat16),
     lambda: [torch.randn(32, 512).bfloat16()], linear_gelu_fp32_accumulate, True),
    ("honest rfft by a DFT matrix", "complex64", Rfft, lambda: [torch.randn(4, 1000)], rfft_by_dft_matrix, True),
    ("honest bf16 RMSNorm (fp32 inside the reference too)", "bfloat16", lambda: RMSNormBf16(2048),
     lambda: [torch.randn(16, 2048).bfloat16()], rmsnorm_bf16_math, True),
    ("honest one-pass layernorm", "float32", lambda: LayerNorm(4096), lambda: [torch.randn(8, 4096)],
     layernorm_one_pass, True),
    ("honest blocked cumsum", "float32", Cumsum, lambda: [torch.randn(8, 4096)], cumsum_sequential_blocks, True),
]


@pytest.mark.parametrize("name,dtype,reference,make_inputs,candidate,passes", ROWS, ids=[r[0] for r in ROWS])
def test_the_relative_l2_rule_follows_the_references_own_rounding(name, dtype, reference, make_inputs, candidate,
                                                                   passes):
    _seeded(0)
    model = reference()
    inputs = make_inputs()
    result, out = judge(model, inputs, candidate)
    assert str(out.dtype).removeprefix("torch.") == dtype
    if passes:
        assert result.passed, f"{name}: a known-good kernel rejected: {result.message}"
        assert result.precision.startswith("float64 run"), result.precision
    else:
        assert not result.passed, f"{name}: a wrong output passed ({result.precision})"
        assert "mismatch" in result.message


WRONG_FLOAT = [r for r in ROWS if not r[-1] and r[1] == "float32"]


@pytest.mark.parametrize("name,dtype,reference,make_inputs,candidate,passes", WRONG_FLOAT,
                         ids=[r[0] for r in WRONG_FLOAT])
def test_the_wrong_float_rows_are_within_atol_everywhere_and_under_the_old_floor(name, dtype, reference, make_inputs,
                                                                                 candidate, passes):
    """What made them pass before: every element within atol, a relative L2 error under 1%."""
    _seeded(0)
    model = reference()
    inputs = make_inputs()
    with torch.no_grad():
        ref = model(*inputs)
        out = candidate(model, *inputs)
    assert float((out - ref).abs().max()) < 1e-4
    rel = float((out - ref).norm() / ref.norm())
    assert 1e-4 < rel < 1e-2, rel


def test_complex_outputs_are_compared_in_both_parts_and_name_the_part():
    ref = torch.fft.rfft(torch.randn(3, 64), dim=-1)
    out = ref.clone()
    out.imag[1, 5] += 1.0
    result = compare_outputs([ref], [received(out)], None, None)
    assert not result.passed and "first at [1, 5, 1]" in result.message, result.message
    assert compare_outputs([ref], [received(ref.clone())], None, None).passed


def _kb_level2_9():
    spec = importlib.util.spec_from_file_location("kb_level2_9", KB / "level2" / "9_Matmul_Subtract_Multiply_ReLU.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _relu_residue_kernel(block: int):
    """The honest level2/9 kernel's arithmetic: a K loop of `block` columns (1: sequential)."""
    def run(model, x):
        w, b = model.linear.weight, model.linear.bias
        acc = torch.zeros(x.shape[0], w.shape[0])
        for k in range(0, x.shape[1], block):
            acc = acc + x[:, k:k + block] @ w[:, k:k + block].t()
        return torch.relu((acc + b - model.subtract_value) * model.multiply_value)
    return run


# KernelBench level2/9 on signed-normal inputs (issue 40): ReLU keeps one output, the residue of
# (x @ W - 2.0) * 1.5 with x @ W near 2.0, and the kernel's fp32 rounding there is 1e-4 of the
# output's norm or more. Seeds where that happens (found with in_features 1024, out 128, batch 16);
# 279 with a sequential K loop: the reference's own error at the check's inputs is small by chance,
# and the second look (its error at neighbouring inputs) keeps the honest kernel passing.
RESIDUE_ROWS = [(1, 32), (84, 32), (277, 32), (84, 1), (145, 1), (279, 1)]


@pytest.mark.skipif(not KB.is_dir(), reason="KernelBench is not in ../shared/kernelbench")
@pytest.mark.parametrize("seed,block", RESIDUE_ROWS)
def test_relu_residue_of_kernelbench_level2_9_passes(seed, block):
    problem = _kb_level2_9()
    torch.manual_seed(seed)
    model = problem.Model(1024, 128, problem.subtract_value, problem.multiply_value)
    x = torch.randn(16, 1024)
    result, out = judge(model, [x], _relu_residue_kernel(block))
    with torch.no_grad():
        ref = model(x)
    assert int((ref > 0).sum()) <= 2  # the case of issue 40: a residue or two left by ReLU
    assert float((out - ref).norm() / ref.norm()) > 1e-4  # over rtol against the fp32 reference
    assert result.passed, f"honest level2/9 (seed {seed}, K block {block}) rejected: {result.message}"


@pytest.mark.skipif(not KB.is_dir(), reason="KernelBench is not in ../shared/kernelbench")
def test_the_second_look_is_what_keeps_the_unlucky_residue_passing(monkeypatch):
    problem = _kb_level2_9()
    torch.manual_seed(279)
    model = problem.Model(1024, 128, problem.subtract_value, problem.multiply_value)
    x = torch.randn(16, 1024)
    result, _ = judge(model, [x], _relu_residue_kernel(1))
    assert result.passed and "second look" in result.precision, result.message
    monkeypatch.setattr(precise, "NEIGHBOURS", 0)
    torch.manual_seed(279)
    model = problem.Model(1024, 128, problem.subtract_value, problem.multiply_value)
    alone, _ = judge(model, [x], _relu_residue_kernel(1))
    assert not alone.passed and "float64" in alone.message


def test_without_a_float64_run_a_dropped_block_still_fails():
    x = torch.randn(2, 131072)
    ref = torch.softmax(x, dim=-1)
    result = compare_outputs([ref], [received(softmax_without_last_block(None, x))], None, None,
                             precise.Precise(None, "no float64 run: test"))
    assert not result.passed and "no float64 run: test" in result.message, result.message


# --- where a float64 run means nothing: today's rules, and the record says why ----------------

class Dropout(nn.Module):
    def forward(self, x):
        return torch.nn.functional.dropout(x, 0.5, training=True)


class Narrowing(nn.Module):
    def forward(self, x):
        return (x.float() * 3).softmax(-1)


class Indices(nn.Module):
    def forward(self, x):
        return torch.argmax(x, dim=-1)


NO_RUN_ROWS = [
    ("random ops", Dropout, lambda: torch.randn(8, 64), "draws random numbers"),
    ("computes in float32 inside", Narrowing, lambda: torch.randn(8, 64), "computes in float32"),
    ("float64 outputs", Softmax, lambda: torch.randn(8, 64).double(), "float64 already"),
]


@pytest.mark.parametrize("name,reference,make_input,why", NO_RUN_ROWS, ids=[r[0] for r in NO_RUN_ROWS])
def test_no_float64_run_where_it_means_nothing(name, reference, make_input, why):
    model = reference()
    x = make_input()
    high = precise.HighPrecision(model, CPU)
    wide = high.copies([x])
    torch.manual_seed(5)
    with torch.no_grad():
        ref = model(x.clone())
    state = torch.random.get_rng_state()
    run = high.run(wide, [ref])
    assert torch.equal(torch.random.get_rng_state(), state)  # the reference's own draws are untouched
    assert run.outputs is None and why in run.note, run.note
    result = compare_outputs([ref], [received(ref.clone())], None, None, run)
    assert result.passed and why in result.precision, result.message


def test_integer_outputs_stay_exact_and_need_no_float64_run():
    model = Indices()
    x = torch.randn(8, 64)
    high = precise.HighPrecision(model, CPU)
    ref = model(x)
    run = high.run(high.copies([x]), [ref])
    assert run.outputs is None and run.note == ""
    out = ref.clone()
    out[3] += 1
    assert not compare_outputs([ref], [received(out)], None, None, run).passed


def test_a_float64_run_too_large_for_the_memory_is_not_made(monkeypatch):
    monkeypatch.setattr(precise, "_available_bytes", lambda device: 1000)
    high = precise.HighPrecision(Softmax(), CPU)
    x = torch.randn(8, 64)
    assert high.copies([x]) is None and "GiB may be planned" in high.note
    run = high.run(None, [torch.softmax(x, -1)])
    assert run.outputs is None and "GiB may be planned" in run.note


def test_a_gpu_float64_run_is_capped_whatever_is_free(monkeypatch):
    """Jobs beside this one take the device's free memory after this run planned from it: the
    ledger plans none of a float64 copy, so on a GPU the run is capped (MAX_DEVICE_BYTES)."""
    monkeypatch.setattr(precise, "_available_bytes", lambda device: 140 << 30)
    assert precise._allowed_bytes(torch.device("cuda")) == precise.MAX_DEVICE_BYTES
    assert precise._allowed_bytes(torch.device("cpu")) == 70 << 30


def test_a_slow_float64_run_is_not_made_again(monkeypatch):
    monkeypatch.setattr(precise, "MAX_SECONDS", 0.0)
    high = precise.HighPrecision(Softmax(), CPU)
    x = torch.randn(8, 64)
    assert high.run(high.copies([x]), [torch.softmax(x, -1)]).outputs is not None
    assert high.copies([x]) is None and "took" in high.note


def test_an_output_zero_in_float64_is_judged_by_the_rule_without_it():
    """x - mean(x) of a constant row: zero in float64, rounding left in fp32 (honest either way)."""
    class Centre(nn.Module):
        def forward(self, x):
            return x - x.mean(dim=-1, keepdim=True)

    x = torch.full((4, 1000), 0.1)
    result, _ = judge(Centre(), [x], lambda model, v: v - v.sum(dim=-1, keepdim=True) / v.shape[-1])
    assert result.passed, result.message
    assert "zero" in result.precision, result.precision
