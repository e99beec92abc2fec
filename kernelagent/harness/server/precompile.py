"""Pre-compiling a CUDA candidate's sources with nvcc on a machine without a GPU (started by the
harness server: nothing of the candidate is executed, its literal sources are compiled). The
compilers read the candidate's bytes, so they run in the candidate's jail (server/tool_jail.py),
after a source that names a file outside its build directory is refused (cuda_source.check_includes)."""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelagent import settings
from kernelagent.harness.cuda_source import (SourceMap, extract_extensions, generated_files, compact_errors, check_flags,
                                             check_includes, CudaBuildError, ExtensionSpec)
from kernelagent.harness.result import Status
from kernelagent.harness.server import verdict
from kernelagent.harness.verdict import Concluded
from kernelagent.harness.server.tool_jail import ToolJail, ToolRun, bounded_message

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
    return settings.get("KERNELAGENT_CUDA_ARCH")


@dataclass
class PrecompileResult:
    ok: bool
    message: str = ""
    seconds: float = 0.0
    skipped: str = ""  # why nothing was compiled ("" when something was)
    commands: list[str] = field(default_factory=list)
    jail_note: str = ""  # where the compilers ran without the per-job jail: that, for the result
    harness_fault: str = ""  # the jail could not be entered: nothing is said about the candidate

    def verdict(self) -> Concluded:
        """What the compile says, for the verdict fold (harness/verdict.py; `compiled` where it
        is compiled): a harness error where nothing could be said about the candidate: no nvcc,
        sources built at run time, no jail to compile in."""
        if self.harness_fault:
            return Concluded(Status.HARNESS_ERROR, "the compilers' jail could not be entered, so nothing was "
                                                   "compiled: " + self.harness_fault, "compile")
        if self.ok:
            return Concluded(Status.COMPILED, "the CUDA sources compiled with nvcc (compile-only: this machine has "
                                              "no GPU, so the extension was not linked or run; correctness and "
                                              "timing need a GPU)", "compile")
        if self.skipped:
            return Concluded(Status.HARNESS_ERROR, "cannot check this CUDA candidate without a GPU: " + self.skipped,
                             "compile")
        return Concluded(Status.COMPILE_ERROR, self.message, "compile")

    def flags(self) -> list[dict[str, str]]:
        """Where the compilers ran without the per-job jail (as candidates run here), an
        `isolation` note that says so (tool_jail.ToolJail.note)."""
        return [verdict.flag("isolation", self.jail_note)] if self.jail_note else []


@dataclass
class _Toolchain:
    """What every compile of one candidate shares: the compilers, torch's flags and includes."""
    nvcc: str
    cxx: str | None
    abi: int
    common_nvcc: list[str]
    includes: list[str]


def _toolchain(specs: list[Any]) -> _Toolchain | PrecompileResult:
    """The compilers and torch's build settings, or why nothing can be compiled here (a skip)."""
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
    return _Toolchain(nvcc=nvcc, cxx=cxx, abi=abi, common_nvcc=common_nvcc, includes=includes)


def _start_extension(n: int, spec: ExtensionSpec, *, chain: _Toolchain, std: str, arch: str, tools: ToolJail, workdir: Path,
                     commands: list[str], procs: list[tuple[str, ToolRun, dict[str, SourceMap]]]) -> str:
    """Check one load_inline extension's flags and includes, write its generated files and start
    its compilers (appended to `procs`, their command lines to `commands`); the refusal, if any."""
    try:
        cuda_flags = check_flags("extra_cuda_cflags", spec.extra_cuda_cflags)
        c_flags = check_flags("extra_cflags", spec.extra_cflags)
    except CudaBuildError as exc:
        return f"load_inline at candidate.py:{spec.line}: {exc}"
    folder = workdir.resolve() / f"ext{n}"
    folder.mkdir(parents=True, exist_ok=True)
    files = generated_files(spec)
    defines = [f"-DTORCH_EXTENSION_NAME={re.sub(r'[^A-Za-z0-9_]', '_', spec.name)}",
               "-DTORCH_API_INCLUDE_EXTENSION_H", f"-D_GLIBCXX_USE_CXX11_ABI={chain.abi}"]
    inc = [f"-I{d}" for d in chain.includes]
    maps = {fname: smap for fname, (_, smap) in files.items()}
    try:
        for fname, (text, _) in files.items():  # the generated bindings (functions=) included
            check_includes("cuda_sources" if fname == "cuda.cu" else "cpp_sources", text)
    except CudaBuildError as exc:
        return f"load_inline at candidate.py:{spec.line}: {exc}"
    for fname, (text, _) in files.items():
        (folder / fname).write_text(text)
    if "cuda.cu" in files:
        # Paths in full: the jail starts its program in `workdir` (its scratch).
        cmd = [chain.nvcc, "-c", str(folder / "cuda.cu"), "-o", str(folder / "cuda.o"), *defines, *inc,
               *chain.common_nvcc, std, f"-gencode=arch=compute_{arch},code=sm_{arch}", "--compiler-options", "-fPIC",
               *cuda_flags]
        commands.append(" ".join(cmd))
        procs.append((spec.name, tools.start(cmd, cwd=folder, scratch=workdir), maps))
    if chain.cxx and "main.cpp" in files:
        cmd = [chain.cxx, "-fsyntax-only", str(folder / "main.cpp"), *defines, *inc, std, "-fPIC", *c_flags]
        commands.append(" ".join(cmd))
        procs.append((spec.name, tools.start(cmd, cwd=folder, scratch=workdir), maps))
    return ""


def _wait_compilers(procs: list[tuple[str, ToolRun, dict[str, SourceMap]]], *, deadline: float,
                    errors: list[str]) -> tuple[bool, str]:
    """Wait for every compiler until `deadline`; their errors appended to `errors`. Whether one ran
    past the deadline, and the jail's fault (the last one seen; "" when the jail held)."""
    timed_out = False
    fault = ""
    for name, run, maps in procs:
        if not run.wait(deadline):
            timed_out = True
        elif run.jail_failed:
            fault = bounded_message(run.output().strip().splitlines()[0], 300)
        elif run.returncode != 0:
            errors.append(compact_errors(run.output(), maps, name=name))
    return timed_out, fault


def precompile(source: str, workdir: Path, timeout: float = 300.0, arch: str | None = None,
               jail: dict[str, Any] | None = None) -> PrecompileResult:
    """Compile every load_inline extension of a candidate without a GPU: nvcc -c on its CUDA
    sources, c++ -fsyntax-only on its C++ sources (same generated files, flags and includes as
    torch's build), in parallel, each in the job's jail (`jail`: child/jail.resolve's settings;
    ToolJail.of). Compact errors on failure, cleaned and bounded (tool_jail.bounded_message)."""
    started = time.monotonic()
    specs = extract_extensions(source)
    if not specs:
        return PrecompileResult(False, skipped="the candidate calls no torch.utils.cpp_extension.load_inline: "
                                                "a CUDA candidate builds its kernels with load_inline")
    chain = _toolchain(specs)
    if isinstance(chain, PrecompileResult):
        return chain
    std = _torch_std()
    arch = arch or default_arch()
    procs: list[tuple[str, ToolRun, dict[str, SourceMap]]] = []
    errors: list[str] = []
    commands: list[str] = []
    workdir.mkdir(parents=True, exist_ok=True)
    chain.includes = chain.includes + _cpu_torch_stubs(workdir, chain.includes)
    # What the compilers read under a hidden directory (a toolkit in a home, say) is bound back.
    tools = ToolJail.of(jail, workdir, keep_ro=[Path(chain.nvcc).resolve().parent.parent, *map(Path, chain.includes)])
    for n, spec in enumerate(specs):
        if refused := _start_extension(n, spec, chain=chain, std=std, arch=arch, tools=tools, workdir=workdir,
                                       commands=commands, procs=procs):
            errors.append(refused)
    timed_out, fault = _wait_compilers(procs, deadline=started + timeout, errors=errors)
    seconds = time.monotonic() - started
    if fault:
        return PrecompileResult(False, seconds=seconds, commands=commands, jail_note=tools.note, harness_fault=fault)
    if timed_out:
        errors.append(f"the compiler ran past its {timeout:.0f} s limit and was killed")
    if errors:
        return PrecompileResult(False, bounded_message("\n".join(errors)), seconds, commands=commands,
                                jail_note=tools.note)
    return PrecompileResult(True, "compiled with nvcc", seconds, commands=commands, jail_note=tools.note)
