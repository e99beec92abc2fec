"""The kernel tracer's build (kernelagent/harness/trace/build.py, issue 55) on the CPU: where it
looks for CUPTI and cuda.h, what it says when something is missing (never an exception), the
cache, and, where this machine has CUPTI's headers (Triton bundles them), the library itself:
its exported entry points and a marks handle that is a no-op when no tracer was injected."""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import pytest

from kernelagent.harness.trace import build, marks

ACTIVITY_H = "\n".join(["typedef struct { int a; } CUpti_ActivityKernel9;",
                        "typedef struct { int a; } CUpti_ActivityKernel10;",
                        "typedef struct { int a; } CUpti_ActivityMemcpy6;",
                        "typedef struct { int a; } CUpti_ActivityMemcpyPtoP4;",
                        "typedef struct { int a; } CUpti_ActivityMemset4;"])


def _touch(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _wheel(site: Path, *, cuda_h: bool = True, crt: bool = False) -> None:
    """torch 2.11's layout: nvidia/cu13/{include,lib}; its include folder has cuda.h, no crt/."""
    inc = site / "nvidia" / "cu13" / "include"
    _touch(inc / "cupti.h")
    _touch(inc / "cupti_activity.h", ACTIVITY_H)
    if cuda_h:
        _touch(inc / "cuda.h")
    if crt:
        _touch(inc / "crt" / "host_defines.h")
    _touch(site / "nvidia" / "cu13" / "lib" / "libcupti.so.13")


def _cuda_home(home: Path) -> None:
    _touch(home / "include" / "cuda.h")
    _touch(home / "include" / "crt" / "host_defines.h")


@pytest.fixture(autouse=True)
def no_system_cuda(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "SYSTEM_CUDA", (str(tmp_path / "no-system-cuda"),))


@pytest.mark.parametrize("layout,expect", [
    # (the device's first build failed on this one: cuda.h beside cupti.h, crt/ only in CUDA_HOME)
    ("wheel-without-crt+cuda-home", "cuda-home"),
    ("wheel-with-crt", "wheel"),
    ("wheel-without-crt", "unavailable: crt/host_defines.h"),
    ("wheel-without-cuda-h", "unavailable: cuda.h"),
    ("nothing", "unavailable: no CUPTI"),
])
def test_the_toolchain_is_found_or_the_reason_given(tmp_path, layout, expect):
    site, home = tmp_path / "site", tmp_path / "cuda"
    site.mkdir()
    if layout != "nothing":
        _wheel(site, cuda_h=layout != "wheel-without-cuda-h", crt=layout == "wheel-with-crt")
    if layout.endswith("+cuda-home"):
        _cuda_home(home)
    found = build.find_toolchain(roots=[site], env={"CUDA_HOME": str(home), "PATH": os.environ["PATH"]})
    if expect.startswith("unavailable"):
        assert isinstance(found, build.Unavailable) and not found
        assert expect.split(": ", 1)[1] in found.reason
        assert isinstance(build.library(roots=[site], env={"CUDA_HOME": str(home)}, cache_dir=tmp_path / "c"),
                          build.Unavailable)
    else:
        assert isinstance(found, build.Toolchain)
        assert found.cupti_lib == site / "nvidia" / "cu13" / "lib" / "libcupti.so.13"
        assert found.cupti_include == site / "nvidia" / "cu13" / "include"
        assert found.cuda_include == (home / "include" if expect == "cuda-home" else found.cupti_include)
        assert dict(found.structs) == {"KA_KERNEL_T": "CUpti_ActivityKernel10", "KA_MEMCPY_T": "CUpti_ActivityMemcpy6",
                                       "KA_MEMSET_T": "CUpti_ActivityMemset4"}


def test_no_compiler_is_a_reason_not_an_exception(tmp_path):
    site, home = tmp_path / "site", tmp_path / "cuda"
    _wheel(site)
    _cuda_home(home)
    found = build.library(roots=[site], env={"CUDA_HOME": str(home), "CC": str(tmp_path / "no-cc")},
                          cache_dir=tmp_path / "c")
    assert isinstance(found, build.Unavailable) and "--version" in found.reason


def test_a_failed_compile_is_a_reason_with_the_compiler_s_words(tmp_path):
    site, home = tmp_path / "site", tmp_path / "cuda"
    _wheel(site)
    _cuda_home(home)  # empty headers: cupti.h declares nothing, so tracer.c cannot compile
    found = build.library(roots=[site], env={"CUDA_HOME": str(home), "PATH": os.environ["PATH"]},
                          cache_dir=tmp_path / "c")
    assert isinstance(found, build.Unavailable) and found.reason.startswith("building the tracer failed")
    assert not list((tmp_path / "c" / "trace").glob(".tmp-*"))


REAL = build.find_toolchain()


@pytest.mark.skipif(isinstance(REAL, build.Unavailable), reason=f"no CUPTI headers here: {getattr(REAL, 'reason', '')}")
def test_the_tracer_builds_exports_its_entry_points_and_is_cached(tmp_path):
    lib = build.library(cache_dir=tmp_path)
    assert isinstance(lib, Path), lib
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    exported = {line.split()[-1] for line in symbols.splitlines() if " T " in line}
    assert {"InitializeInjection", "kernelagent_trace_mark", "kernelagent_trace_flush",
            "kernelagent_trace_counts"} <= exported
    assert build.library(cache_dir=tmp_path) == lib  # a hit: same key, hash checked
    lib.write_bytes(lib.read_bytes() + b"\0")         # bytes that no longer match their hash
    rebuilt = build.library(cache_dir=tmp_path)
    assert rebuilt == lib and (lib.parent / "sha256").read_text() == build._sha(lib)


@pytest.mark.skipif(isinstance(REAL, build.Unavailable), reason="no CUPTI headers here")
def test_marks_are_no_ops_until_a_tracer_is_injected(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_INJECTION64_PATH", "/x")
    monkeypatch.setenv("KERNELAGENT_TRACE_FD", "9")
    handle = marks.attach()
    assert not handle.available and "no tracer" in handle.reason
    assert handle.mark(stream=0, phase=marks.TIMED, index=0, end=False) == -1 and handle.counts() == (0, 0)
    assert "CUDA_INJECTION64_PATH" not in os.environ and "KERNELAGENT_TRACE_FD" not in os.environ
    lib = build.library(cache_dir=tmp_path)
    ctypes.CDLL(str(lib))  # loaded, as the driver would, but InitializeInjection never ran
    handle = marks.attach()  # found by its soname, RTLD_NOLOAD
    assert handle.available
    assert handle.mark(stream=0, phase=marks.TIMED, index=0, end=False) == -1  # not enabled: nothing launched
    assert handle.flush(final=True) == -1 and handle.counts() == (0, 0)
