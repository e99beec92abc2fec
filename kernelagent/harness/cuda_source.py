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
- Process launches: the audit hook (child/audit_hook.py, installed by defences.Monitor) rejects processes started by candidate code.
  ninja, nvcc and the host compiler are started by torch's cpp_extension; the hook allows
  those only while a build that went through this wrapper is running (`in_build`), so calling
  torch's private build helpers directly (a way to run an arbitrary build.ninja) is refused.
- Evidence: the returned module is wrapped so that each call into it counts as a launch of the
  candidate's own kernels, and the `__global__` function names of the sources are the names
  the profiler's kernels are matched against on CUDA (child/cuda_evidence.py device_time_share).

Compiler errors (`compact_errors`): torch puts the build log in the exception text; only the
first few `error` lines are kept, each with its source line and caret, and locations inside
the generated `cuda.cu` / `main.cpp` are mapped back to `candidate.py` lines where the sources
are literal strings.

Without a GPU (`precompile`): the CPU build of torch cannot link a CUDA extension, so the
harness server extracts the literal `cuda_sources` / `cpp_sources` of each `load_inline` call
from the candidate's AST, writes the same files torch would, and compiles them with
`nvcc -c` and `c++ -fsyntax-only` (in parallel, with a timeout). That gives the same compact
errors on any machine with nvcc, and is what CI checks. On a GPU the real build in the
candidate's process reports the errors instead (no second compilation). The compilers read the
candidate's bytes, so they run in its jail (server/tool_jail.py), after a source that names a
file outside its build directory is refused (`check_includes`, here and in the build hook).
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
from kernelagent import pyast

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


def mangled_base_name(name: str) -> str | None:
    """The bare function name in an Itanium-mangled symbol, as CUPTI reports a CUDA kernel
    ('_Z11relu_kernelPKfPfi' -> 'relu_kernel', '_ZN2at4cuda12_GLOBAL__N_111spin_kernelEl' ->
    'spin_kernel', '_Z2tkIfEvPKT_' -> 'tk'); None for anything it does not read. Pure and bounded
    (no c++filt): only the name's own prefix is read, never its parameter types."""
    if not name.startswith("_Z"):
        return None
    i, n = 2, len(name)
    if name.startswith("L", i):
        i += 1
    nested = name.startswith("N", i)
    if nested:
        i += 1
        while i < n and name[i] in "rVKRO":  # cv- and ref-qualifiers of a member function
            i += 1
    last = None
    while i < n:
        if name.startswith("St", i):
            i += 2
        elif name[i] == "S":  # a substitution (S_, S0_, ...): a name seen before
            end = name.find("_", i)
            if end < 0:
                return last
            i = end + 1
        elif name[i].isdigit():
            j = i
            while j < n and name[j].isdigit():
                j += 1
            length = int(name[i:j]) if j - i <= 4 else 0
            if length <= 0 or j + length > n:
                return last
            last, i = name[j:j + length], j + length
            if not nested:
                return last
        else:  # template arguments (I), the end of the nesting (E), or what is not read here
            return last
    return last


def kernel_base_name(name: str) -> str:
    """The bare function name of a kernel as the profiler shows it: 'void ns::relu<float>(float
    const*, float*, int)' -> 'relu', a mangled one as CUPTI gives it likewise
    (mangled_base_name); a Triton kernel's name is returned as it is."""
    mangled = mangled_base_name(name.strip())
    if mangled:
        return mangled
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


# Device kernels that are glue by their names: copies (contiguous, dtype casts, memcpy) and fills
# (zeros, empty's first touch, memset). Anything else PyTorch ran on the device is work. A
# library kernel is glue only by its own name, never because nothing recorded it (issue 24).
_GLUE_KERNEL = re.compile(r"copy|memcpy|memset|fill", re.I)


def is_glue_kernel(name: str) -> bool:
    return bool(_GLUE_KERNEL.search(name))


def is_own_kernel(name: str, own_names: set[str]) -> bool:
    """Whether a profiler kernel name is one of the candidate's own kernels (Triton names match
    as they are or with a suffix; CUDA names by their bare function name)."""
    if not own_names:
        return False
    if any(name == n or name.startswith(n + "_") or name.startswith(n + "(") for n in own_names):
        return True
    return kernel_base_name(name) in own_names


def is_glue(kernel: dict[str, Any]) -> bool:
    """A library kernel that is glue by its name: a copy or a fill (is_glue_kernel), by the
    demangled name a profiler printed or by the mangled one."""
    return is_glue_kernel(str(kernel.get("name", ""))) or is_glue_kernel(str(kernel.get("mangled", "")))


def short_name(name: str, width: int = 90) -> str:
    """A kernel's name for a message: its function name, then as much of the rest as fits."""
    base = kernel_base_name(name)
    return name[:width] if base in name[:width] else f"{base}: {name[:width - len(base) - 2]}"


def static_own_names(source: str) -> set[str]:
    """The candidate's own kernel names, from its source text: functions decorated with a
    Triton decorator (`triton.jit`, `jit`, `triton.autotune(...)`, `triton.heuristics(...)`)
    and the `__global__` functions in its CUDA strings."""
    names = set(global_kernel_names(source))
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return names
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                text = ast.unparse(target)
                if text.split(".")[-1] in ("jit", "autotune", "heuristics"):
                    names.add(node.name)
                    break
    return names


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
# Includes: only the build directory's own files and the system's and torch's headers
# --------------------------------------------------------------------------------------

# A directive that names a file: #include / #include_next / #import / #embed "x" or <x>, and
# #line N "x" or a GNU line marker `# N "x"` (the compilers print the source lines of a
# diagnostic from the file a #line names). `#` may be spelt `%:` (a digraph) or `??=`.
_FILE_DIRECTIVE = re.compile(r'^[ \t]*(?:#|%:|\?\?=)[ \t]*(?P<kw>include_next|include|import|embed|line|(?=\d))'
                             r'[ \t]*(?:\d+[ \t]*)?(?P<open>[<"])(?P<path>[^>"\n]*)[>"]', re.M)
_HAS_INCLUDE = re.compile(r'__has_(?:include_next|include|embed)[ \t]*\([ \t]*(?P<open>[<"])(?P<path>[^>"\n]*)[>"]')
_SPLICE = re.compile(r"\\[ \t]*\r?\n")
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def _leaves_the_build_dir(path: str) -> bool:
    """An absolute path, or one whose `..` climb out of the directory it is looked up from."""
    import posixpath

    if path.startswith(("/", "~", "\\")) or re.match(r"[A-Za-z]:", path):
        return True
    norm = posixpath.normpath(path.replace("\\", "/"))
    return norm == ".." or norm.startswith("../")


def foreign_includes(text: str) -> list[str]:
    """The directives of a C++/CUDA source that name a file outside the build directory (an
    absolute path, or `..` out of it): an #include of `~/.netrc` would have the compiler quote
    its lines in the diagnostics. Read on the text with its line splices joined, both with and
    without its comments (`#/**/include`), so that a string holding `/*` hides nothing.
    The first line of defence: the compiler runs in the candidate's jail, where the host's
    files are out of sight anyway (a path made by a macro is not seen here)."""
    spliced = _SPLICE.sub("", text)
    found: list[str] = []
    for view in (spliced, _COMMENT.sub(" ", spliced)):
        for m in list(_FILE_DIRECTIVE.finditer(view)) + list(_HAS_INCLUDE.finditer(view)):
            if _leaves_the_build_dir(m.group("path")):
                said = " ".join(m.group(0).split())[:160]
                if said not in found:
                    found.append(said)
    return found


def check_includes(kind: str, text: Any) -> None:
    """Raises CudaBuildError when `text` (a source of `kind`) names a file outside the build
    directory (foreign_includes)."""
    found = foreign_includes(str(text))
    if found:
        raise CudaBuildError(f"{kind}: {found[0]} names a file outside the build directory: a candidate includes "
                             "only headers by <name> (the system's, CUDA's and torch's) or by a relative path "
                             "without '..', and #line names no file outside it"
                             + (f" ({len(found) - 1} more such directive{'s' if len(found) > 2 else ''})"
                                if len(found) > 1 else ""))


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
        tree = pyast.parse(source, filename="candidate.py")
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
