"""CUDA C++ candidates (`backend="cuda"`): building them, caching the builds, and compiler
errors a model can act on.

A CUDA candidate defines `ModelNew` and builds its kernels with
`torch.utils.cpp_extension.load_inline` (usually at import time, so the build happens in the
candidate's own process, inside the load stage and under its hard timeout).

Building (`BuildHook`, installed in the candidate's process before the candidate is imported)
- `load_inline` / `load` are wrapped. The wrapper checks the arguments (compiler and linker
  flags from an allowlist, no build directory or include path outside the job's scratch
  directory, no precompiled header, which torch would write into its own install), and then
  lets torch build in the job's own `TORCH_EXTENSIONS_DIR` (set per job by workers.child_setup):
  parallel jobs never share a build directory, so they never collide or wait on each other's
  locks.
- Build cache: content-keyed, `<cache>/<candidate sha256>/<key>/<name>.so`, where the key
  hashes the extension's name, sources, bindings, flags, the GPU architecture and the torch,
  CUDA and Python versions. The candidate's process only reads the cache. After the job, the
  harness server copies each freshly built `.so` (listed by the hook in the job's scratch
  directory) into the cache. Entries live under the sha256 of the candidate file that built
  them, a value the server supplies: a candidate that forges the list can only ever poison its
  own entries, never another candidate's build.
- Process launches: the audit hook (defences.py) rejects processes started by candidate code.
  ninja, nvcc and the host compiler are started by torch's cpp_extension; the hook allows
  those only while a build that went through this wrapper is running (`in_build`), so calling
  torch's private build helpers directly (a way to run an arbitrary build.ninja) is refused.
- Evidence: the returned module is wrapped so that each call into it counts as a launch of the
  candidate's own kernels, and the `__global__` function names of the sources are the names
  the profiler's kernels are matched against on CUDA (defences.device_time_share).

Compiler errors (`compact_errors`): torch puts the build log in the exception text; only the
first few `error` lines are kept, each with its source line and caret, and locations inside
the generated `cuda.cu` / `main.cpp` are mapped back to `candidate.py` lines where the sources
are literal strings.

Without a GPU (`precompile`): the CPU build of torch cannot link a CUDA extension, so the
harness server extracts the literal `cuda_sources` / `cpp_sources` of each `load_inline` call
from the candidate's AST, writes the same files torch would, and compiles them with
`nvcc -c` and `c++ -fsyntax-only` (in parallel, with a timeout). That gives the same compact
errors on any machine with nvcc, and is what CI checks. On a GPU the real build in the
candidate's process reports the errors instead (no second compilation).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

BACKENDS = ("triton", "cuda")
MANIFEST = ".kernelagent-builds.json"
MAX_ERRORS = 4
CUDA_PRELUDE = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
CPP_PRELUDE = ["#include <torch/extension.h>"]

# Compiler flags a candidate may pass (each flag as one token). Anything else is refused with a
# message listing these: `-ccbin`, `-Xlinker`, plugins, output paths, `@file` and friends can run
# or overwrite programs.
_ALLOWED_FLAGS = [
    r"-O[0-3s]?", r"--?use_fast_math", r"-lineinfo", r"--generate-line-info", r"-std=c\+\+(14|17|20)",
    r"-D[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.+\-]*)?", r"-U[A-Za-z_][A-Za-z0-9_]*",
    r"--expt-relaxed-constexpr", r"--expt-extended-lambda", r"--extended-lambda",
    r"-Xptxas=[A-Za-z0-9_=,.\-]+", r"--ptxas-options=[A-Za-z0-9_=,.\-]+", r"-Xptxas", r"-v", r"-dlcm=c[ag]",
    r"--?maxrregcount=\d+", r"-res-usage", r"--resource-usage", r"-w", r"-Wall", r"-Wextra",
    r"-Wno-[A-Za-z0-9\-]+", r"-ffast-math", r"-funroll-loops", r"-march=native", r"-fopenmp", r"--restrict",
    r"-arch=(sm|compute)_\d+[a-z]?", r"-gencode=arch=compute_\d+[a-z]?,code=(sm|compute)_\d+[a-z]?",
    r"--threads=\d+", r"-t\d+", r"--ftz=(true|false)", r"--prec-div=(true|false)",
    r"--prec-sqrt=(true|false)", r"--fmad=(true|false)", r"-g", r"-G",
]
_ALLOWED_FLAG_RE = re.compile("|".join(f"(?:{p})" for p in _ALLOWED_FLAGS))
_ALLOWED_LDFLAGS = re.compile(r"-lcuda|-lcudart")


class CudaBuildError(RuntimeError):
    """The candidate's CUDA extension failed to build; the message is already compact."""


# --------------------------------------------------------------------------------------
# Names: __global__ functions in the sources, kernel names in the profiler
# --------------------------------------------------------------------------------------

_GLOBAL_RE = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:[\w:<>,\s\*&]+?\s+)?"
                        r"(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)\s*\(")


def global_kernel_names(source: str) -> set[str]:
    """Names of the `__global__` functions defined or declared in CUDA `source`."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S)
    return {m.group(1) for m in _GLOBAL_RE.finditer(text)} - {"void"}


def kernel_base_name(name: str) -> str:
    """The bare function name of a kernel as the profiler shows it: 'void ns::relu<float>(float
    const*, float*, int)' -> 'relu'; a Triton kernel's name is returned as it is."""
    text = name.strip().replace("(anonymous namespace)", "anonymous")
    depth, cut = 0, len(text)
    for i, ch in enumerate(text):  # the parameter list starts at the first '(' outside <...>
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif ch == "(" and depth == 0:
            cut = i
            break
    head = text[:cut]
    depth, out = 0, []
    for ch in head:  # drop template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    head = "".join(out).strip()
    head = head.split()[-1] if head.split() else head  # drop the return type ("void")
    return head.split("::")[-1]


def is_own_kernel(name: str, own_names: set[str]) -> bool:
    """Whether a profiler kernel name is one of the candidate's own kernels (Triton names match
    as they are or with a suffix; CUDA names by their bare function name)."""
    if not own_names:
        return False
    if any(name == n or name.startswith(n + "_") or name.startswith(n + "(") for n in own_names):
        return True
    return kernel_base_name(name) in own_names


# --------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------

def check_flags(kind: str, flags: Any) -> list[str]:
    """The flags, as a list of strings; raises CudaBuildError for one that is not allowed."""
    if flags is None:
        return []
    if isinstance(flags, str):
        flags = [flags]
    out = []
    for flag in flags:
        if not isinstance(flag, str):
            raise CudaBuildError(f"{kind} must be strings (got {type(flag).__name__})")
        allowed = _ALLOWED_LDFLAGS if kind == "extra_ldflags" else _ALLOWED_FLAG_RE
        if not allowed.fullmatch(flag):
            raise CudaBuildError(
                f"{kind}: the flag {flag!r} is not allowed for candidates. Allowed: optimisation levels, "
                "--use_fast_math, -lineinfo, -std=c++17/20, -D/-U macros, --expt-relaxed-constexpr, "
                "-Xptxas=<opts>, --maxrregcount=N, -arch/-gencode for sm_XX, -res-usage"
                + ("; linker: -lcuda, -lcudart" if kind == "extra_ldflags" else ""))
        out.append(flag)
    return out


# --------------------------------------------------------------------------------------
# Compact compiler errors
# --------------------------------------------------------------------------------------

# nvcc / EDG:  file(12): error: ...     gcc/clang:  file:12:5: error: ...     ptxas / nvlink / ld
_DIAG_RE = re.compile(r"^(?P<file>[^\s:()][^:()]*?)(?:\((?P<nline>\d+)\)|:(?P<gline>\d+)(?::(?P<col>\d+))?):"
                      r"\s*(?P<sev>fatal error|error|catastrophic error|warning|note|remark)[^:]*:\s*(?P<msg>.*)$")
_TOOL_ERROR_RE = re.compile(r"^(ptxas|nvlink|ld|/usr/bin/ld|collect2)[^:]*:?\s*(fatal|error)", re.I)


@dataclass
class SourceMap:
    """Maps a line of a generated file (cuda.cu or main.cpp) to where it came from."""

    # (first line in the generated file, number of lines, what, first candidate.py line or None)
    spans: list[tuple[int, int, str, int | None]] = field(default_factory=list)

    def locate(self, line: int) -> str | None:
        for first, count, what, cand_line in self.spans:
            if first <= line < first + count:
                inner = line - first + 1
                if cand_line is not None:
                    return f"candidate.py:{cand_line + inner - 1} ({what} line {inner})"
                return f"{what} line {inner}"
        return None


def _short(line: str, width: int = 220) -> str:
    line = line.rstrip()
    return line if len(line) <= width else line[:width] + " ..."


def _line_in_candidate(echoed: str, candidate_source: str | None) -> int | None:
    """The candidate.py line that holds `echoed` (the source line a compiler prints under an
    error), when exactly one line does. Robust to however the build laid out its files."""
    text = echoed.strip()
    if not candidate_source or len(text) < 8:
        return None
    hits = [n for n, line in enumerate(candidate_source.splitlines(), 1) if line.strip() == text]
    return hits[0] if len(hits) == 1 else None


def compact_errors(log: str, maps: dict[str, SourceMap] | None = None, limit: int = MAX_ERRORS,
                   name: str | None = None, candidate_source: str | None = None) -> str:
    """The first `limit` errors of a build log, each with its source line and caret, locations
    mapped to candidate.py where possible, and a count of the rest. Falls back to the log's
    last lines when it holds no recognisable error."""
    maps = maps or {}
    lines = log.splitlines()
    blocks: list[tuple[bool, list[str]]] = []  # (in the candidate's own source, lines)
    total = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _DIAG_RE.match(line.strip())
        tool = _TOOL_ERROR_RE.match(line.strip())
        if m and m.group("sev") in ("error", "fatal error", "catastrophic error"):
            total += 1
            base = Path(m.group("file")).name
            lineno = int(m.group("nline") or m.group("gline"))
            where = maps[base].locate(lineno) if base in maps else None
            own = base in maps
            head = f"{where or f'{base}:{lineno}'}: error: {m.group('msg').strip()}"
            context = []
            j = i + 1
            while j < len(lines) and len(context) < 3:
                nxt = lines[j]
                if not nxt.strip() or _DIAG_RE.match(nxt.strip()) or _TOOL_ERROR_RE.match(nxt.strip()) \
                        or nxt.startswith(("In file included", "FAILED:", "ninja:", "[")):
                    break
                if re.match(r"^\s+detected during", nxt):
                    at = re.search(r"at line (\d+) of \"?([^\"\s]+)", nxt)
                    if at and Path(at.group(2)).name in maps:
                        loc = maps[Path(at.group(2)).name].locate(int(at.group(1)))
                        context.append(f"    (instantiated from {loc or at.group(0)})")
                        own = True
                    j += 1
                    continue
                context.append(_short(nxt))
                j += 1
            if context and (where is None or "candidate.py" not in where):
                cand_line = _line_in_candidate(context[0], candidate_source)
                if cand_line is not None:
                    head = f"candidate.py:{cand_line}: error: {m.group('msg').strip()}"
                    own = True
            blocks.append((own, [_short(head)] + context))
            i = j
            continue
        if tool:
            total += 1
            blocks.append((True, [_short(line.strip())]))
        i += 1
    if not blocks:
        tail = [_short(x) for x in lines if x.strip() and not x.startswith(("[", "ninja: build stopped"))][-12:]
        return "\n".join(tail) or "the build failed without output"
    # The candidate's own errors first: an error deep inside a torch header usually comes
    # with one in the candidate's code that explains it.
    chosen = [b for own, b in blocks if own][:limit] or [b for _, b in blocks][:limit]
    title = f"CUDA extension {name!r} failed to build" if name else "the build failed"
    shown = len(chosen)
    head = f"{title}: {total} error{'s' if total != 1 else ''}" + (f" (first {shown} shown)" if total > shown else "")
    return "\n".join([head] + ["\n".join(b) for b in chosen])


def demangle(text: str) -> str:
    """Demangle C++ symbols in a message (an undefined symbol at import time) when c++filt exists."""
    filt = shutil.which("c++filt")
    if not filt:
        return text
    def one(m: re.Match) -> str:
        try:
            out = subprocess.run([filt, m.group(0)], capture_output=True, text=True, timeout=5)
            return out.stdout.strip() or m.group(0)
        except (OSError, subprocess.TimeoutExpired):
            return m.group(0)
    return re.sub(r"_Z[A-Za-z0-9_]+", one, text)


# --------------------------------------------------------------------------------------
# Static extraction of load_inline calls (for the CPU pre-compile)
# --------------------------------------------------------------------------------------

@dataclass
class Chunk:
    text: str
    line: int | None  # candidate.py line of the text's first line (None: not a plain literal)


@dataclass
class ExtensionSpec:
    name: str
    line: int
    cpp_sources: list[Chunk] = field(default_factory=list)
    cuda_sources: list[Chunk] = field(default_factory=list)
    functions: list[str] | None = None
    extra_cflags: list[str] = field(default_factory=list)
    extra_cuda_cflags: list[str] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)  # arguments that are not literals


_LOAD_INLINE_PARAMS = ["name", "cpp_sources", "cuda_sources", "sycl_sources", "functions", "extra_cflags",
                       "extra_cuda_cflags"]


class _Resolver:
    def __init__(self, tree: ast.Module):
        self.names: dict[str, ast.AST] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.names[node.targets[0].id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self.names[node.target.id] = node.value

    def value(self, node: ast.AST, depth: int = 0) -> Any:
        """A literal value, or raises ValueError."""
        if depth > 20:
            raise ValueError("too deep")
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
            return node.value
        if isinstance(node, ast.Name) and node.id in self.names:
            return self.value(self.names[node.id], depth + 1)
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.value(e, depth + 1) for e in node.elts]
        if isinstance(node, ast.Dict):
            return {self.value(k, depth + 1): self.value(v, depth + 1) for k, v in zip(node.keys, node.values)
                    if k is not None}
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.value(node.left, depth + 1) + self.value(node.right, depth + 1)
        if isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values):
            return "".join(str(v.value) for v in node.values)
        raise ValueError(ast.dump(node)[:80])

    def chunks(self, node: ast.AST) -> list[Chunk]:
        target = node
        seen = 0
        while isinstance(target, ast.Name) and target.id in self.names and seen < 20:
            target = self.names[target.id]
            seen += 1
        if isinstance(target, (ast.List, ast.Tuple)):
            return [c for e in target.elts for c in self.chunks(e)]
        value = self.value(target)
        if isinstance(value, list):
            return [Chunk(str(v), None) for v in value]
        line = target.lineno if isinstance(target, ast.Constant) else None
        return [Chunk(str(value), line)]


def extract_extensions(source: str) -> list[ExtensionSpec]:
    """Every `load_inline(...)` call in `source` with its literal arguments (what cannot be
    resolved statically is listed in `unresolved`)."""
    try:
        tree = ast.parse(source, filename="candidate.py")
    except SyntaxError:
        return []
    resolver = _Resolver(tree)
    specs = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        fname = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if fname != "load_inline":
            continue
        args: dict[str, ast.AST] = {}
        for param, arg in zip(_LOAD_INLINE_PARAMS, node.args):
            args[param] = arg
        for kw in node.keywords:
            if kw.arg:
                args[kw.arg] = kw.value
        spec = ExtensionSpec(name="ext", line=node.lineno)
        for key in ("name", "cpp_sources", "cuda_sources", "functions", "extra_cflags", "extra_cuda_cflags"):
            if key not in args:
                continue
            try:
                if key == "name":
                    spec.name = str(resolver.value(args[key]))
                elif key in ("cpp_sources", "cuda_sources"):
                    setattr(spec, key, resolver.chunks(args[key]))
                elif key == "functions":
                    value = resolver.value(args[key])
                    spec.functions = [value] if isinstance(value, str) else list(value)
                else:
                    value = resolver.value(args[key])
                    setattr(spec, key, [value] if isinstance(value, str) else [str(v) for v in value or []])
            except (ValueError, TypeError):
                spec.unresolved.append(key)
        specs.append(spec)
    return specs


def generated_files(spec: ExtensionSpec) -> dict[str, tuple[str, SourceMap]]:
    """The files load_inline would write, {"main.cpp": (text, map), "cuda.cu": (text, map)}."""
    out = {}
    for fname, prelude, chunks, what in (("main.cpp", CPP_PRELUDE, spec.cpp_sources, "cpp_sources"),
                                         ("cuda.cu", CUDA_PRELUDE, spec.cuda_sources, "cuda_sources")):
        if fname == "cuda.cu" and not chunks:
            continue
        smap = SourceMap()
        parts = list(prelude)
        line = len(prelude) + 1
        for k, chunk in enumerate(chunks):
            count = chunk.text.count("\n") + 1
            label = what if len(chunks) == 1 else f"{what}[{k}]"
            smap.spans.append((line, count, label, chunk.line))
            parts.append(chunk.text)
            line += count
        if fname == "main.cpp" and spec.functions:
            binding = ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
            binding += [f'm.def("{f}", torch::wrap_pybind_function({f}), "{f}");' for f in spec.functions]
            binding.append("}")
            smap.spans.append((line, len(binding), "the bindings generated for functions=", None))
            parts += binding
        out[fname] = ("\n".join(parts), smap)
    return out


# --------------------------------------------------------------------------------------
# Toolchain
# --------------------------------------------------------------------------------------

def find_nvcc() -> str | None:
    for candidate in (os.environ.get("CUDA_HOME") and os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"),
                      shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _torch_std() -> str:
    """The C++ standard torch builds extensions with (c++20 from torch 2.10 on, c++17 before)."""
    try:
        import torch.utils.cpp_extension as ce

        return "-std=c++20" if "-std=c++20" in Path(ce.__file__).read_text() else "-std=c++17"
    except Exception:  # noqa: BLE001
        return "-std=c++17"


def _include_dirs(nvcc: str) -> list[str]:
    import sysconfig

    import torch.utils.cpp_extension as ce

    dirs = list(ce.include_paths("cpu"))
    dirs.append(str(Path(nvcc).resolve().parent.parent / "include"))
    dirs.append(sysconfig.get_paths()["include"])
    return dirs


def _cpu_torch_stubs(workdir: Path, includes: list[str]) -> list[str]:
    """A CPU build of torch ships c10/cuda's headers but not the one its CMake generates;
    supply it (it only defines C10_CUDA_BUILD_SHARED_LIBS) so that <c10/cuda/...> compiles."""
    name = Path("c10/cuda/impl/cuda_cmake_macros.h")
    if any((Path(d) / name).exists() for d in includes):
        return []
    stub = workdir / "stub-include"
    (stub / name).parent.mkdir(parents=True, exist_ok=True)
    (stub / name).write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    return [str(stub)]


def default_arch() -> str:
    """The architecture to pre-compile for without a GPU (the GPUs we target: H100/H200)."""
    return os.environ.get("KERNELAGENT_CUDA_ARCH", "90")


@dataclass
class PrecompileResult:
    ok: bool
    message: str = ""
    seconds: float = 0.0
    skipped: str = ""  # why nothing was compiled ("" when something was)
    commands: list[str] = field(default_factory=list)


def precompile(source: str, workdir: Path, timeout: float = 300.0, arch: str | None = None) -> PrecompileResult:
    """Compile every load_inline extension of a candidate without a GPU: nvcc -c on its CUDA
    sources, c++ -fsyntax-only on its C++ sources (same generated files, flags and includes as
    torch's build), in parallel. Compact errors on failure."""
    started = time.monotonic()
    specs = extract_extensions(source)
    if not specs:
        return PrecompileResult(False, skipped="the candidate calls no torch.utils.cpp_extension.load_inline: "
                                                "a CUDA candidate builds its kernels with load_inline")
    nvcc = find_nvcc()
    if nvcc is None:
        return PrecompileResult(False, skipped="nvcc was not found (CUDA_HOME, PATH, /usr/local/cuda): CUDA "
                                                "candidates cannot be compiled on this machine")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    unresolved = [f"{s.name}: {', '.join(s.unresolved)}" for s in specs if s.unresolved]
    if unresolved:
        return PrecompileResult(False, skipped="the sources of load_inline are built at run time, so they cannot "
                                                "be compiled without a GPU (" + "; ".join(unresolved) + ")")
    try:
        import torch

        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        import torch.utils.cpp_extension as ce

        common_nvcc = list(ce.COMMON_NVCC_FLAGS)
        includes = _include_dirs(nvcc)
    except Exception as exc:  # noqa: BLE001
        return PrecompileResult(False, skipped=f"torch's extension headers are unavailable: {exc}")
    std = _torch_std()
    arch = arch or default_arch()
    procs: list[tuple[str, subprocess.Popen, dict[str, SourceMap]]] = []
    errors: list[str] = []
    commands = []
    workdir.mkdir(parents=True, exist_ok=True)
    includes = includes + _cpu_torch_stubs(workdir, includes)
    for n, spec in enumerate(specs):
        try:
            cuda_flags = check_flags("extra_cuda_cflags", spec.extra_cuda_cflags)
            c_flags = check_flags("extra_cflags", spec.extra_cflags)
        except CudaBuildError as exc:
            errors.append(f"load_inline at candidate.py:{spec.line}: {exc}")
            continue
        folder = workdir / f"ext{n}"
        folder.mkdir(parents=True, exist_ok=True)
        files = generated_files(spec)
        defines = [f"-DTORCH_EXTENSION_NAME={re.sub(r'[^A-Za-z0-9_]', '_', spec.name)}",
                   "-DTORCH_API_INCLUDE_EXTENSION_H", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
        inc = [f"-I{d}" for d in includes]
        maps = {fname: smap for fname, (_, smap) in files.items()}
        for fname, (text, _) in files.items():
            (folder / fname).write_text(text)
        if "cuda.cu" in files:
            cmd = [nvcc, "-c", "cuda.cu", "-o", "cuda.o", *defines, *inc, *common_nvcc, std,
                   f"-gencode=arch=compute_{arch},code=sm_{arch}", "--compiler-options", "-fPIC", *cuda_flags]
            commands.append(" ".join(cmd))
            procs.append((spec.name, subprocess.Popen(cmd, cwd=folder, stdout=subprocess.PIPE,
                                                      stderr=subprocess.STDOUT, text=True,
                                                      start_new_session=True), maps))
        if cxx and "main.cpp" in files:
            cmd = [cxx, "-fsyntax-only", "main.cpp", *defines, *inc, std, "-fPIC", *c_flags]
            commands.append(" ".join(cmd))
            procs.append((spec.name, subprocess.Popen(cmd, cwd=folder, stdout=subprocess.PIPE,
                                                      stderr=subprocess.STDOUT, text=True,
                                                      start_new_session=True), maps))
    deadline = started + timeout
    timed_out = False
    for name, proc, maps in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, 9)
            except OSError:
                pass
            proc.communicate()
            continue
        if proc.returncode != 0:
            errors.append(compact_errors(out, maps, name=name))
    seconds = time.monotonic() - started
    if timed_out:
        errors.append(f"the compiler ran past its {timeout:.0f} s limit and was killed")
    if errors:
        return PrecompileResult(False, "\n".join(errors), seconds, commands=commands)
    return PrecompileResult(True, "compiled with nvcc", seconds, commands=commands)


# --------------------------------------------------------------------------------------
# Run time: the wrapper around load_inline / load in the candidate's process
# --------------------------------------------------------------------------------------

class _ExtensionModule:
    """The built module as the candidate sees it: every call into it counts as a launch of
    the candidate's own kernels."""

    def __init__(self, module: Any, on_call: Callable[[str], None]):
        object.__setattr__(self, "_ka_module", module)
        object.__setattr__(self, "_ka_on_call", on_call)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._ka_module, name)
        if callable(value) and not isinstance(value, type) and not name.startswith("_"):
            on_call = self._ka_on_call

            def call(*args: Any, **kwargs: Any) -> Any:
                on_call(name)
                return value(*args, **kwargs)

            call.__name__ = name
            call.__doc__ = getattr(value, "__doc__", None)
            return call
        return value

    def __dir__(self) -> list[str]:
        return dir(self._ka_module)

    def __repr__(self) -> str:
        return f"<CUDA extension {getattr(self._ka_module, '__name__', '?')}>"


def _import_extension(name: str, path: Path) -> Any:
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


class BuildHook:
    """Installed in the candidate's process (before the candidate is imported) when the
    backend is cuda. See the module docstring."""

    def __init__(self, scratch: Path, cache_dir: str | Path | None, candidate_sha: str, arch: str | None):
        self.scratch = Path(scratch).resolve()
        self.cache_dir = Path(cache_dir) / candidate_sha[:32] if cache_dir else None
        self.arch = arch or ""
        self.in_build = 0
        self.own_names: set[str] = set()
        self.calls = 0
        self.last_error: str | None = None
        self.builds: list[dict[str, Any]] = []  # {name, key, cached, seconds}
        self.on_call: Callable[[str], None] = lambda name: None

    def install(self) -> None:
        import torch.utils.cpp_extension as ce  # imported here, before the audit hook exists

        self._original_load_inline = ce.load_inline
        self._original_load = ce.load
        hook = self

        def load_inline(name, cpp_sources, cuda_sources=None, *args, **kwargs):
            return hook.load_inline(name, cpp_sources, cuda_sources, *args, **kwargs)

        def load(name, sources, *args, **kwargs):
            return hook.load(name, sources, *args, **kwargs)

        load_inline.__doc__ = ce.load_inline.__doc__
        load.__doc__ = ce.load.__doc__
        ce.load_inline = load_inline
        ce.load = load

    # -- checks ------------------------------------------------------------------------
    def _inside(self, path: Any) -> bool:
        try:
            full = Path(str(path)).resolve()
        except (OSError, RuntimeError):
            return False
        return full == self.scratch or self.scratch in full.parents

    def _check(self, name: Any, kwargs: dict[str, Any]) -> None:
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name):
            raise CudaBuildError(f"the extension name must be a Python identifier (got {name!r})")
        for key in ("extra_cflags", "extra_cuda_cflags", "extra_ldflags"):
            kwargs[key] = check_flags(key, kwargs.get(key))
        for path in kwargs.get("extra_include_paths") or []:
            if not self._inside(path):
                raise CudaBuildError(f"extra_include_paths: {path} is outside the candidate's scratch directory")
        if kwargs.get("build_directory") is not None and not self._inside(kwargs["build_directory"]):
            raise CudaBuildError("build_directory must be left out (the harness gives each job its own)")
        if kwargs.get("use_pch"):
            raise CudaBuildError("use_pch=True writes into torch's own install; leave it out")
        for key in ("extra_sycl_cflags", "with_sycl", "sycl_sources"):
            if kwargs.get(key):
                raise CudaBuildError(f"{key} is not supported")
        if kwargs.get("is_python_module") is False:
            raise CudaBuildError("is_python_module=False is not supported: call the extension's functions "
                                 "from ModelNew.forward")

    def _key(self, name: str, payload: dict[str, Any]) -> str:
        import platform

        import torch

        data = {"name": name, "payload": payload, "arch": self.arch, "torch": torch.__version__,
                "cuda": torch.version.cuda, "python": platform.python_version(), "format": 1}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()

    # -- the wrappers ------------------------------------------------------------------
    def load_inline(self, name: Any, cpp_sources: Any, cuda_sources: Any = None, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise CudaBuildError("pass load_inline's arguments after cuda_sources by keyword")
        self._check(name, kwargs)
        cuda_list = [cuda_sources] if isinstance(cuda_sources, str) else list(cuda_sources or [])
        cpp_list = [cpp_sources] if isinstance(cpp_sources, str) else list(cpp_sources or [])
        for text in cuda_list:
            self.own_names |= global_kernel_names(str(text))
        payload = {"cpp": cpp_list, "cuda": cuda_list, "functions": kwargs.get("functions"),
                   "flags": [kwargs.get(k) for k in ("extra_cflags", "extra_cuda_cflags", "extra_ldflags")],
                   "with_pytorch_error_handling": kwargs.get("with_pytorch_error_handling", True),
                   "no_implicit_headers": kwargs.get("no_implicit_headers", False)}
        kwargs.pop("verbose", None)
        kwargs.pop("build_directory", None)
        return self._build(name, payload, lambda: self._original_load_inline(
            name, cpp_list, cuda_list or None, verbose=False, **kwargs), cpp_list, cuda_list)

    def load(self, name: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise CudaBuildError("pass load's arguments after sources by keyword")
        self._check(name, kwargs)
        sources = [sources] if isinstance(sources, str) else list(sources)
        texts = []
        for src in sources:
            if not self._inside(src):
                raise CudaBuildError(f"load(): source {src} is outside the candidate's scratch directory")
            text = Path(src).read_text(errors="replace")
            texts.append(text)
            if str(src).endswith(".cu"):
                self.own_names |= global_kernel_names(text)
        payload = {"sources": texts, "flags": [kwargs.get(k) for k in ("extra_cflags", "extra_cuda_cflags",
                                                                          "extra_ldflags")]}
        kwargs.pop("verbose", None)
        kwargs.pop("build_directory", None)
        return self._build(name, payload, lambda: self._original_load(name, sources, verbose=False, **kwargs),
                           [], [])

    def _build(self, name: str, payload: dict[str, Any], build: Callable[[], Any], cpp_list: list[Any],
               cuda_list: list[Any]) -> Any:
        started = time.monotonic()
        key = self._key(name, payload)
        record: dict[str, Any] = {"name": name, "key": key, "cached": False}
        self.builds.append(record)
        cached = self.cache_dir / key / f"{name}.so" if self.cache_dir else None
        if cached is not None and cached.is_file():
            try:
                module = _import_extension(name, cached)
                record.update(cached=True, seconds=time.monotonic() - started)
                return _ExtensionModule(module, self._called)
            except ImportError:
                pass  # a stale or broken entry: build afresh
        self.in_build += 1
        try:
            module = build()
        except Exception as exc:  # noqa: BLE001 - every build failure becomes a compact error
            text = str(exc)
            maps = {}
            if cpp_list or cuda_list:
                spec = ExtensionSpec(name=name, line=0, cpp_sources=[Chunk(str(t), None) for t in cpp_list],
                                     cuda_sources=[Chunk(str(t), None) for t in cuda_list],
                                     functions=_function_names(payload.get("functions")))
                maps = {f: m for f, (_, m) in generated_files(spec).items()}
            if isinstance(exc, ImportError) or "undefined symbol" in text:
                message = f"CUDA extension {name!r} built but failed to load: {demangle(text)[-800:]}"
            else:
                try:
                    candidate_source = (self.scratch / "candidate.py").read_text(errors="replace")
                except OSError:
                    candidate_source = None
                message = compact_errors(text, maps, name=name, candidate_source=candidate_source)
            self.last_error = message
            raise CudaBuildError(message) from None
        finally:
            self.in_build -= 1
        record["seconds"] = time.monotonic() - started
        so_path = getattr(module, "__file__", None)
        if so_path and self._inside(so_path):
            self._note_built(key, name, Path(so_path))
        return _ExtensionModule(module, self._called)

    def _called(self, name: str) -> None:
        self.calls += 1
        self.on_call(name)

    def _note_built(self, key: str, name: str, so_path: Path) -> None:
        manifest = self.scratch / MANIFEST
        try:
            entries = json.loads(manifest.read_text()) if manifest.exists() else []
        except (OSError, ValueError):
            entries = []
        entries.append({"key": key, "name": name, "so": str(so_path)})
        manifest.write_text(json.dumps(entries))


def _function_names(functions: Any) -> list[str] | None:
    if functions is None:
        return None
    if isinstance(functions, str):
        return [functions]
    return [str(f) for f in functions]


# --------------------------------------------------------------------------------------
# Server side: publish what a job built into the cache
# --------------------------------------------------------------------------------------

def publish(scratch: Path, cache_dir: str | Path | None, candidate_sha: str, max_bytes: int = 512 << 20) -> int:
    """Copy the .so files a finished job built into the cache. Called by the server after the
    candidate's process group is dead. Returns how many entries were added."""
    if not cache_dir:
        return 0
    manifest = Path(scratch) / MANIFEST
    if not manifest.is_file() or manifest.is_symlink() or manifest.stat().st_size > 1 << 20:
        return 0
    try:
        entries = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return 0
    root = Path(cache_dir) / candidate_sha[:32]
    scratch_real = Path(scratch).resolve()
    added = 0
    for entry in entries[:16] if isinstance(entries, list) else []:
        try:
            key, name, so = str(entry["key"]), str(entry["name"]), Path(str(entry["so"]))
        except (KeyError, TypeError):
            continue
        if not re.fullmatch(r"[0-9a-f]{64}", key) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name):
            continue
        if so.is_symlink() or not so.is_file() or scratch_real not in so.resolve().parents:
            continue
        if so.stat().st_size > max_bytes:
            continue
        final = root / key
        if (final / f"{name}.so").exists():
            continue
        tmp = root / f".tmp-{uuid.uuid4().hex}"
        try:
            tmp.mkdir(parents=True)
            shutil.copyfile(so, tmp / f"{name}.so")
            os.replace(tmp, final)
            added += 1
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return added


def arch_of(capability: str | None) -> str:
    """'9.0' -> '9.0' for TORCH_CUDA_ARCH_LIST (and the cache key)."""
    return capability or ""


__all__ = ["BACKENDS", "BuildHook", "CudaBuildError", "PrecompileResult", "check_flags", "compact_errors",
           "extract_extensions", "global_kernel_names", "is_own_kernel", "kernel_base_name", "precompile",
           "publish"]

if __name__ == "__main__":  # python -m kernelagent.harness.cuda_build candidate.py: pre-compile it here
    result = precompile(Path(sys.argv[1]).read_text(), Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/ka-pre"))
    print(result.message or result.skipped)
    sys.exit(0 if result.ok else 1)
