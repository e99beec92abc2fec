"""The CUDA backend without a GPU: compact compiler errors (nvcc runs here), the static pass,
flag checks, kernel-name matching, and the build hook's sandbox rules (a CPU-only C++
extension builds through the same load_inline wrapper)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kernelagent.harness import EvalConfig, Status
from kernelagent.harness import cuda_source
from kernelagent.harness.caller import static_check
from kernelagent.harness.server import build_cache
from kernelagent.harness.server.precompile import find_nvcc
from tests.conftest import CANDIDATES, REPO, TESTS, read

# One worker for the file (pytest-xdist): its module fixtures (an evaluator, the nvcc build of relu_typo) are made once.
pytestmark = pytest.mark.xdist_group("cuda_backend")

CUDA = TESTS / "cuda_candidates"
RELU = CANDIDATES / "relu_problem.py"
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")


# -- compact errors --------------------------------------------------------------------

NVCC_SPEW = """[1/3] /usr/local/cuda/bin/nvcc -c cuda.cu -o cuda.cuda.o ...
FAILED: cuda.cuda.o
/opt/torch/include/c10/core/AutogradState.h(89): warning #3306-D: a default bit-field initializer is a C++20 feature
    bool view_replay_enabled_ : 1 = false;
                                  ^
/opt/torch/include/ATen/core/TensorBase.h(500): error: no instance of function template "at::TensorBase::data_ptr" matches the argument list
            detected during instantiation of "T *at::TensorBase::data_ptr<T>() const [with T=double3]" at line 9 of /tmp/x/cuda.cu
""" + "".join(f"/opt/torch/include/ATen/core/T{i}.h({i}): note: candidate template ignored\n" for i in range(300)) + """
/tmp/x/cuda.cu(7): error: identifier "blockIdxx" is undefined
      int i = blockIdxx.x * blockDim.x + threadIdx.x;
              ^

/tmp/x/cuda.cu(12): error: expected a ";"
  }
  ^

3 errors detected in the compilation of "/tmp/x/cuda.cu".
ninja: build stopped: subcommand failed.
"""


def test_compact_errors_keeps_the_candidates_errors_with_source_and_caret():
    smap = cuda_source.SourceMap(spans=[(4, 20, "cuda_sources", 10)])
    text = cuda_source.compact_errors(NVCC_SPEW, {"cuda.cu": smap}, name="ext")
    lines = text.splitlines()
    assert lines[0] == "CUDA extension 'ext' failed to build: 3 errors"
    assert "candidate.py:13 (cuda_sources line 4): error: identifier \"blockIdxx\" is undefined" in text
    assert "int i = blockIdxx.x" in text and any(line.strip() == "^" for line in lines)
    assert "candidate.py:18 (cuda_sources line 9)" in text
    assert "note: candidate template ignored" not in text and "warning" not in text
    assert len(text) < 1500 and len(lines) < 20


def test_compact_errors_gcc_format_and_fallback():
    log = ("main.cpp: In function 'at::Tensor f(at::Tensor)':\n"
           "main.cpp:5:3: error: 'foo' was not declared in this scope\n"
           "    5 |   foo(x);\n      |   ^~~\n")
    smap = cuda_source.SourceMap(spans=[(2, 10, "cpp_sources", 30)])
    text = cuda_source.compact_errors(log, {"main.cpp": smap})
    assert "candidate.py:33 (cpp_sources line 4): error: 'foo' was not declared" in text and "^~~" in text
    assert "ptxas error" in cuda_source.compact_errors("ptxas error   : Entry function 'k' uses too much shared data")
    assert cuda_source.compact_errors("something odd\nError building extension 'x'") .endswith("Error building extension 'x'")


def test_flags_allowlist():
    assert cuda_source.check_flags("extra_cuda_cflags", ["-O3", "--use_fast_math", "-Xptxas=-v", "-DBLOCK=256",
                                                        "-gencode=arch=compute_90a,code=sm_90a"])
    for bad in (["-ccbin=/tmp/sh"], ["--compiler-bindir", "/x"], ["-Xlinker", "-rpath"], ["@opts.txt"], ["-o", "/etc/x"]):
        with pytest.raises(cuda_source.CudaBuildError, match="not allowed"):
            cuda_source.check_flags("extra_cuda_cflags", bad)
    with pytest.raises(cuda_source.CudaBuildError):
        cuda_source.check_flags("extra_ldflags", ["-lcublas"])


def test_kernel_names():
    src = ("template <typename T> __global__ void __launch_bounds__(256) tk(const T* x) {}\n"
           "__global__ void relu_kernel(const float* x, float* y, int n) {}\n// __global__ void old_k(int)\n")
    assert cuda_source.global_kernel_names(src) == {"tk", "relu_kernel"}
    assert cuda_source.kernel_base_name("void tk<float>(float const*)") == "tk"
    assert cuda_source.kernel_base_name("relu_kernel(float const*, float*, int)") == "relu_kernel"
    assert cuda_source.kernel_base_name("void (anonymous namespace)::ns::k2<4, true>(float*)") == "k2"
    own = {"relu_kernel", "softmax_kernel"}
    assert cuda_source.is_own_kernel("relu_kernel(float const*, float*, long)", own)
    assert cuda_source.is_own_kernel("softmax_kernel_0d1d", own)
    assert not cuda_source.is_own_kernel("void at::native::vectorized_elementwise_kernel<4>(int)", own)


@pytest.mark.parametrize("mangled,base", [
    ("_Z11relu_kernelPKfPfi", "relu_kernel"),  # CUPTI's names are mangled (the kernel trace, issue 55)
    ("_Z2tkIfEvPKT_", "tk"),
    ("_ZL6kernelPf", "kernel"),
    ("_ZN2at4cuda12_GLOBAL__N_111spin_kernelEl", "spin_kernel"),
    ("_ZNK3foo3barEv", "bar"),
    ("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEEEEviT0_", "vectorized_elementwise_kernel"),
    ("_Z", "_Z"), ("_Z99999x", "_Z99999x"), ("relu_kernel", "relu_kernel")])
def test_mangled_kernel_names(mangled, base):
    assert cuda_source.kernel_base_name(mangled) == base
    assert cuda_source.is_own_kernel(mangled, {"relu_kernel"}) == (base == "relu_kernel")


def test_extract_extensions_maps_lines():
    specs = cuda_source.extract_extensions(read(CUDA / "relu_typo.py"))
    assert len(specs) == 1 and specs[0].name == "ka_relu_typo" and not specs[0].unresolved
    assert specs[0].functions == ["relu"] and specs[0].extra_cuda_cflags == ["-O3"]
    files = cuda_source.generated_files(specs[0])
    text, smap = files["cuda.cu"]
    line = text.splitlines().index(next(x for x in text.splitlines() if "blockIdxx" in x)) + 1
    assert smap.locate(line).startswith("candidate.py:8 ")


# -- static pass -------------------------------------------------------------------------

def test_static_pass_by_backend():
    ok = read(CUDA / "relu_ok.py")
    assert static_check.check_source(ok, backend="cuda") == []
    assert [f.kind for f in static_check.check_source(ok, backend="triton")] == ["wrong-backend"]
    bad = ok.replace("auto y = torch::empty_like(xc);", "auto y = torch::relu(xc); system(\"sh\");")
    kinds = {(f.kind, f.line) for f in static_check.check_source(bad, backend="cuda")}
    assert ("no-custom-kernel", 18) in kinds and ("sandbox-escape", 18) in kinds
    fallback = ok.replace("        return ext.relu_forward(x)",
                          "        try:\n            return ext.relu_forward(x)\n        except RuntimeError:\n"
                          "            return x.clamp_min(0)")
    assert "fallback-to-reference" in {f.kind for f in static_check.check_source(fallback, backend="cuda")}
    cublas = ok.replace("auto y = torch::empty_like(xc);", "auto y = torch::empty_like(xc); cublasSgemm(0);")
    assert any(f.kind == "no-custom-kernel" and "cublasSgemm" in f.message
               for f in static_check.check_source(cublas, backend="cuda"))


# -- through the harness (no GPU: compile-only with nvcc) ------------------------------

@pytest.fixture(scope="module")
def cpu_evaluator(tmp_path_factory):
    from kernelagent.harness import Evaluator

    with Evaluator(device="cpu", cache_dir=tmp_path_factory.mktemp("cache")) as ev:
        yield ev


@pytest.fixture(scope="module")
def typo_through_the_cli(tmp_path_factory):
    """relu_typo.py through `kernelagent eval --backend cuda --json` once: its nvcc build takes
    most of a minute on the CPU, and both tests below read the same verdict (the CLI's JSON is the
    Evaluator's result)."""
    from typer.testing import CliRunner

    from kernelagent.cli import app

    out = CliRunner().invoke(app, ["eval", str(RELU), str(CUDA / "relu_typo.py"), "--backend", "cuda", "--device",
                                   "cpu", "--json", "--cache-dir", str(tmp_path_factory.mktemp("typo-cache"))])
    return out.exit_code, out.output


@needs_nvcc
def test_compile_error_is_compact_and_well_formed(typo_through_the_cli):
    code, output = typo_through_the_cli
    result = json.loads(output.strip().splitlines()[-1])
    print("\n" + result["reason"], f"\n[{result['stage_seconds'].get('nvcc', 0):.1f} s]")
    assert result["status"] == Status.COMPILE_ERROR and result["stage"] == "compile" and not result["compiled"]
    lines = result["reason"].splitlines()
    assert lines[0] == "CUDA extension 'ka_relu_typo' failed to build: 1 error"
    assert lines[1] == 'candidate.py:8 (cuda_sources line 3): error: identifier "blockIdxx" is undefined'
    assert "long i = (long)blockIdxx.x" in lines[2] and lines[3].strip() == "^"
    assert len(result["reason"]) < 600 and len(lines) <= 6
    # `ext.relu(x)` was once rejected statically as a tensor's .relu(): it reaches the compiler,
    # which reports the error the candidate really has (tests/test_static_check.py, without a build)
    assert "static" not in result["reason"]
    findings = static_check.check_source(read(CUDA / "relu_typo.py"), backend="cuda")
    assert not [f for f in findings if f.severity == "reject"]


@needs_nvcc
def test_correct_source_compiles_without_a_gpu(cpu_evaluator):
    result = cpu_evaluator.evaluate(RELU, read(CUDA / "relu_ok.py"), EvalConfig(backend="cuda"))
    assert result.status == Status.COMPILED and result.compiled and not result.correct
    assert "no GPU" in result.reason and not result.passed


def test_cuda_backend_without_load_inline_is_explained(cpu_evaluator):
    triton_relu = read(CANDIDATES / "relu_triton.py") if (CANDIDATES / "relu_triton.py").exists() else \
        "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    result = cpu_evaluator.evaluate(RELU, triton_relu, EvalConfig(backend="cuda"))
    assert result.status == Status.HARNESS_ERROR and "load_inline" in result.reason


def test_unknown_backend_is_refused(cpu_evaluator):
    with pytest.raises(ValueError, match="backend"):
        cpu_evaluator.evaluate(RELU, read(CUDA / "relu_ok.py"), EvalConfig(backend="rocm"))


@needs_nvcc
def test_eval_cli_backend_cuda(typo_through_the_cli):
    from typer.testing import CliRunner

    from kernelagent.cli import app

    code, output = typo_through_the_cli
    assert code == 1, output
    data = json.loads(output.strip().splitlines()[-1])
    assert data["status"] == "compile_error" and "blockIdxx" in data["reason"]
    bad = CliRunner().invoke(app, ["eval", str(RELU), str(CUDA / "relu_ok.py"), "--backend", "hip"])
    assert bad.exit_code == 2 and "--backend" in bad.output


# -- the build hook and the audit hook (a CPU-only C++ extension) ----------------------

HOOK_SCRIPT = r"""
import json, os, sys, time
from pathlib import Path
scratch, cache = Path(sys.argv[1]), sys.argv[2]
os.chdir(scratch)
os.environ.update(TORCH_EXTENSIONS_DIR=str(scratch / ".torch_extensions"), TMPDIR=str(scratch), HOME=str(scratch))
from kernelagent.harness.child import cuda_build, defences, inputs
from kernelagent.harness.config import EvalConfig
from kernelagent.harness.server import build_cache
# What the server does before the job: copy this candidate's hash-checked cache entries into
# the job's scratch; the hook only ever reads that copy.
staged = build_cache.stage(cache, "c" * 64, scratch / ".ka-build-cache")
builder = cuda_build.BuildHook(scratch, scratch / ".ka-build-cache", "c" * 64, "")
builder.install()
monitor = defences.Monitor(scratch / "candidate.py", scratch, EvalConfig(backend="cuda"), builder=builder)
monitor.install()
started = time.monotonic()
module = inputs.import_file(scratch / "candidate.py", "candidate")
print("HOOK " + json.dumps({"out": module.OUT, "staged": staged, "violations": monitor.state.violations, "builds": builder.builds,
                            "calls": builder.calls, "seconds": time.monotonic() - started}))
"""

HOOK_CANDIDATE = r'''
import subprocess
import torch
import torch.utils.cpp_extension as ce
from torch.utils.cpp_extension import load_inline

ext = load_inline(name="ka_add_one", cpp_sources="torch::Tensor add_one(torch::Tensor x) { return x.add(1); }",
                  functions=["add_one"])
OUT = {"value": ext.add_one(torch.zeros(3)).tolist()}
try:
    subprocess.run(["true"])
    OUT["subprocess"] = "ran"
except PermissionError:
    OUT["subprocess"] = "blocked"
try:
    ce._run_ninja_build(".", False, "x")
    OUT["ninja"] = "ran"
except PermissionError:
    OUT["ninja"] = "blocked"
except Exception as exc:
    OUT["ninja"] = f"ran: {type(exc).__name__}"
try:
    load_inline(name="ka_bad", cpp_sources="int f() { return 1; }", extra_cflags=["-fplugin=/tmp/evil.so"])
    OUT["flags"] = "accepted"
except RuntimeError as exc:
    OUT["flags"] = str(exc)[:80]
'''


def _run_hook(scratch, cache):
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "candidate.py").write_text(HOOK_CANDIDATE)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", HOOK_SCRIPT, str(scratch), str(cache)], capture_output=True,
                          text=True, timeout=600, env=env)
    line = [x for x in proc.stdout.splitlines() if x.startswith("HOOK ")]
    assert line, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(line[-1][5:])


@pytest.mark.skipif(not os.path.exists("/usr/bin/ninja") and not __import__("shutil").which("ninja"),
                    reason="ninja not installed")
def test_build_hook_allows_its_builds_only_and_caches(tmp_path):
    cache = tmp_path / "cache"
    first = _run_hook(tmp_path / "job1", cache)
    print(f"\nfirst build {first['seconds']:.1f} s")
    assert first["out"]["value"] == [1.0, 1.0, 1.0]
    assert first["out"]["subprocess"] == "blocked"  # candidate code may not start processes
    assert first["out"]["ninja"] == "blocked"  # nor reach torch's build helpers directly
    assert "not allowed" in first["out"]["flags"]
    assert first["calls"] == 1 and first["builds"][0]["cached"] is False
    escapes = first["violations"].get("sandbox-escape", [])
    assert any("subprocess.Popen from candidate.py" in v for v in escapes)
    assert any("outside a load_inline build" in v for v in escapes)
    assert not any("ninja" in v and "candidate" not in v and "outside" not in v for v in escapes)
    # The server publishes the job's build; the next job with the same candidate loads it.
    assert build_cache.publish(tmp_path / "job1", cache, "c" * 64) == 1
    second = _run_hook(tmp_path / "job2", cache)
    print(f"cached load {second['seconds']:.1f} s")
    assert first["staged"] == 0 and second["staged"] == 1
    assert second["builds"][0]["cached"] is True and second["out"]["value"] == [1.0, 1.0, 1.0]
    # The server stages only bytes whose hash it recorded at publish: a cache entry changed
    # afterwards is not handed to a job (which then builds afresh).
    entry = cache / ("c" * 32) / first["builds"][0]["key"]
    assert build_cache.stage(cache, "c" * 64, tmp_path / "stage_ok") == 1
    so = entry / "ka_add_one.so"
    so.write_bytes(so.read_bytes() + b"\0")
    assert build_cache.stage(cache, "c" * 64, tmp_path / "stage_bad") == 0
    assert not (tmp_path / "stage_bad").exists() or not any((tmp_path / "stage_bad").rglob("*.so"))
    # A forged manifest only reaches the candidate's own cache folder.
    (tmp_path / "job3").mkdir()
    (tmp_path / "job3" / "evil.so").write_bytes(b"x")
    (tmp_path / "job3" / cuda_source.MANIFEST).write_text(json.dumps(
        [{"key": "f" * 64, "name": "victim", "so": str(tmp_path / "job3" / "evil.so")}]))
    build_cache.publish(tmp_path / "job3", cache, "d" * 64)
    assert (cache / ("d" * 32) / ("f" * 64) / "victim.so").exists()
    assert not (cache / ("c" * 32) / ("f" * 64)).exists()


def test_run_time_build_errors_are_located_in_candidate_py_by_their_source_line():
    # At run time the sources arrive as strings with no line numbers, and the generated file's
    # layout depends on the torch version: the echoed source line locates the error instead.
    candidate = (TESTS / "cuda_candidates" / "relu_typo.py").read_text()
    log = ("/scratch/ext/ka_relu_typo/cuda.cu(9): error: identifier \"blockIdxx\" is undefined\n"
           "      long i = (long)blockIdxx.x * blockDim.x + threadIdx.x;\n"
           "                     ^\n\n1 error detected in the compilation of \"cuda.cu\".\n")
    text = cuda_source.compact_errors(log, {}, name="ka_relu_typo", candidate_source=candidate)
    assert "candidate.py:8: error: identifier \"blockIdxx\" is undefined" in text
    assert len(text.splitlines()) <= 8
