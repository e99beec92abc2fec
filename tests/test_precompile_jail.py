"""Issue 54, class 2: host files must not reach a result through the tools that read a candidate's
bytes. Without a GPU the harness compiles a CUDA candidate's sources with nvcc and the host
compiler (server/precompile.py); a compiler quotes the lines of what it reads, so an `#include`
or a `#line` naming `~/.netrc` put its lines in the result's reason.

What holds (docs/concepts/isolation.md, "tools on candidate bytes"; defences.md):
- a source that names a file outside its build directory (absolute, or `..` out of it) is the
  candidate's compile_error before any compiler runs (cuda_source.check_includes);
- the compilers run in the candidate's jail (server/tool_jail.py): a path made by a macro, which
  the static refusal cannot read, names a file the jail hides ("no such file");
- their diagnostics are the only output, read bounded, cleaned and capped;
- where jobs have no per-job jail, the compilers run as candidates do and the result says so.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import uuid
from pathlib import Path

import pytest

from kernelagent.harness import EvalConfig, Status, cuda_source
from kernelagent.harness.server import precompile as precompile_mod
from kernelagent.harness.server.precompile import find_nvcc
from tests.conftest import CANDIDATES, TESTS, read

pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="Linux namespaces"),
              pytest.mark.xdist_group("precompile_jail")]

RELU = CANDIDATES / "relu_problem.py"
RELU_OK = TESTS / "cuda_candidates" / "relu_ok.py"
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


# -- the static refusal: a table of directives ------------------------------------------

FOREIGN = [
    ('#include "/root/.netrc"', True),
    ("#include </etc/shadow>", True),
    ('#include "../../../../../../root/.netrc"', True),
    ("#include <c10/../../../../../../etc/shadow>", True),
    ('  #  include_next "/etc/shadow"', True),
    ('#import "/etc/shadow"', True),
    ('#embed "/etc/shadow"', True),
    ('#inc\\\nlude "/etc/shadow"', True),  # a line splice
    ('#/* a comment */include "/etc/shadow"', True),
    ('%:include "/etc/shadow"', True),  # the digraph of #
    ('#line 1 "/root/.netrc"', True),  # g++ quotes a diagnostic's line from the file #line names
    ('# 1 "/root/.netrc"', True),  # the GNU line marker
    ('#if __has_include("/root/.netrc")\n#endif', True),
    ('const char* a = "/*";\n#include "/etc/shadow"\nconst char* b = "*/";', True),
    ("#include <torch/extension.h>", False),
    ("#include <c10/cuda/CUDAStream.h>", False),
    ('#include "kernels/../common.h"', False),  # stays inside
    ("#line 20", False),
    ('# 1 "cuda.cu"', False),
    ("#include KA_HEADER", False),  # made by a macro: the jail's to hold
]


@pytest.mark.parametrize("source,refused", FOREIGN, ids=[f"{i}" for i in range(len(FOREIGN))])
def test_directives_naming_a_file_outside_the_build_dir(source, refused):
    assert bool(cuda_source.foreign_includes(source)) is refused
    if refused:
        with pytest.raises(cuda_source.CudaBuildError, match="outside the build directory"):
            cuda_source.check_includes("cuda_sources", source)


def test_the_gpu_build_hook_refuses_them_before_torch_builds(tmp_path):
    from kernelagent.harness.child.cuda_build import BuildHook

    hook = BuildHook(tmp_path, None, "c" * 64, "")
    hook._original_load_inline = lambda *a, **k: pytest.fail("torch's build was reached")
    for kwargs in ({"cpp_sources": '#include "/root/.netrc"'},
                   {"cpp_sources": "int f();", "cuda_sources": '#line 1 "/etc/shadow"\nint g();'},
                   {"cpp_sources": "int f();", "functions": ['f", f, "");\n#include "/etc/shadow"\n//']},
                   {"cpp_sources": "int f();", "functions": {"f": '");\n#line 1 "/etc/shadow"\n//'}}):
        with pytest.raises(cuda_source.CudaBuildError, match="outside the build directory"):
            hook.load_inline("ka_ext", **kwargs)


# -- the jail the compilers run in --------------------------------------------------------

@pytest.fixture(scope="module")
def secrets_on_host():
    """A secret in the caller's home and, as root, one in a top-level directory of its own:
    both hidden from a job, both readable to a process outside the jail."""
    made: list[Path] = []
    home = Path.home() / f".ka-t54-secret-{uuid.uuid4().hex[:8]}"
    home.mkdir()
    made.append(home)
    found = {"home": home / "netrc"}
    if os.geteuid() == 0:
        top = Path("/") / f"ka-t54-secrets-{uuid.uuid4().hex[:8]}"
        top.mkdir()
        made.append(top)
        found["top"] = top / "shadow"
    for kind, path in found.items():
        path.write_text(f"machine api.example.com login bob password HUNTER2-{kind}-{uuid.uuid4().hex}\n")
        path.chmod(0o644)
        path.parent.chmod(0o755)
    yield found
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def _tools():
    from kernelagent.harness.server import tool_jail  # here: the table and end-to-end tests run without it

    return tool_jail


def job_jail(mode: str, root: Path) -> dict:
    """The jail a job of a server with isolation `mode` gets (child/jail.resolve)."""
    from kernelagent.harness.jail import candidate as jail

    root.mkdir(parents=True, exist_ok=True)
    try:
        return jail.resolve(mode, root)
    except RuntimeError as exc:
        pytest.skip(f"per-job namespaces do not work here: {exc}")


def _run(tools, argv: list[str], scratch: Path):
    import time

    run = tools.start(argv, cwd=scratch, scratch=scratch)
    assert run.wait(time.monotonic() + 60)
    return run


@needs_gxx
@pytest.mark.parametrize("trick", ["include", "line"])
@pytest.mark.parametrize("where", ["home", "top"])
@pytest.mark.parametrize("mode", ["namespaces", "none"])
def test_a_jailed_compiler_cannot_read_a_host_file(tmp_path, secrets_on_host, mode, where, trick):
    """The static refusal bypassed (the path made by a macro), the compiler called directly in a
    job's jail: the host file is no such file there. "none" is the control: the same compile
    outside any jail quotes the file, so this test can fail."""
    if where not in secrets_on_host:
        pytest.skip("needs root to make a top-level directory")
    secret = secrets_on_host[where]
    jail = job_jail(mode, tmp_path / "scratch-root")
    scratch = tmp_path / "scratch-root" / "job" / "precompile"
    scratch.mkdir(parents=True)
    body = (f'#define KA_P "{secret}"\n#include KA_P\n' if trick == "include"
            else f'#define KA_P "{secret}"\nint f() {{\n#line 1 KA_P\n  return undefined_thing;\n}}\n')
    (scratch / "x.cpp").write_text(body)
    assert not cuda_source.foreign_includes(body)  # the static refusal does not see it
    tools = _tools().ToolJail.of(jail, scratch)
    run = _run(tools, ["g++", "-fsyntax-only", str(scratch / "x.cpp")], scratch)
    out = run.output()
    print(f"\n[{mode}] {out.strip()[-400:]}")
    content = secret.read_text().strip()
    assert run.returncode != 0
    if mode == "none":  # the control: outside the jail the compiler quotes the file
        assert content in out and not tools.jailed and "without the per-job jail" in tools.note
    else:
        assert tools.jailed and not tools.note
        assert content not in out and "HUNTER2" not in out
        if trick == "include":
            assert "No such file or directory" in out


def test_the_compilers_process_sees_the_hidden_home_and_secret_dirs_absent(tmp_path, secrets_on_host, monkeypatch):
    jail = job_jail("namespaces", tmp_path / "scratch-root")
    scratch = tmp_path / "scratch-root" / "job" / "precompile"
    scratch.mkdir(parents=True)
    monkeypatch.setenv("KA_TEST_API_TOKEN", "canary-token-t54")
    probe = ["sh", "-c", "for p in \"$@\"; do if [ -e \"$p\" ]; then echo \"SEEN $p\"; else echo \"ABSENT $p\"; fi; "
                         "done; echo \"UID $(id -u)\"; echo \"PIDNS $(readlink /proc/self/ns/pid)\"; "
                         "cat /proc/self/environ | tr '\\0' '\\n'", "probe",
             *(str(p) for p in secrets_on_host.values()), str(Path.home() / ".bashrc")]
    run = _run(_tools().ToolJail.of(jail, scratch), probe, scratch)
    out = run.output()
    print("\n" + out[-1500:])
    for path in secrets_on_host.values():
        assert f"ABSENT {path}" in out
    assert f"SEEN {Path.home() / '.bashrc'}" not in out
    assert f"PIDNS {os.readlink('/proc/self/ns/pid')}" not in out  # a pid namespace of its own
    assert "canary-token-t54" not in out  # the allowlisted environment only
    if os.geteuid() == 0:
        assert "UID 65534" in out  # the job's unprivileged uid, as the candidate's process


# -- what comes back: bounded, cleaned ---------------------------------------------------

FAKE_NVCC = r"""#!/bin/sh
# A compiler whose diagnostics carry escape sequences and control characters, and far too much.
printf 'cuda.cu(7): error: \033[31mred\033[0m \033]52;c;Y3VybCBldmls\007 bell\007 back\010 nul-less\n'
printf 'cuda.cu(8): error: %s\n' "$(head -c 3000 /dev/zero | tr '\0' 'x')"
head -c 2000000 /dev/zero | tr '\0' 'y'
exit 1
"""


def _fake_toolkit(tmp_path: Path) -> Path:
    home = tmp_path / "toolkit"
    (home / "bin").mkdir(parents=True)
    for name in ("nvcc", "cxx"):
        path = home / "bin" / name
        path.write_text(FAKE_NVCC)
        path.chmod(path.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH | stat.S_IRGRP | stat.S_IROTH)
    for folder in (tmp_path, home, home / "bin"):
        folder.chmod(0o755)
    return home


def _many_extensions(count: int) -> str:
    calls = "\n".join(f'ext{i} = load_inline(name="ka_ext{i}", cpp_sources="int f{i}();", '
                      f'cuda_sources="__global__ void k{i}() {{}}")' for i in range(count))
    return "from torch.utils.cpp_extension import load_inline\n" + calls + "\n"


@pytest.mark.parametrize("mode", ["namespaces", "none"])
def test_diagnostics_are_cleaned_and_bounded(tmp_path, monkeypatch, mode):
    toolkit = _fake_toolkit(tmp_path)
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    monkeypatch.setenv("CXX", str(toolkit / "bin" / "cxx"))
    jail = job_jail(mode, tmp_path / "scratch-root")
    workdir = tmp_path / "scratch-root" / "job" / "candidate" / "precompile"
    result = precompile_mod.precompile(_many_extensions(12), workdir, timeout=120, jail=jail)
    print(f"\n[{mode}] {len(result.message)} characters:\n{result.message[:600]}")
    assert not result.ok and not result.skipped and not result.harness_fault, result
    assert result.verdict().status == Status.COMPILE_ERROR
    assert len(result.message) <= _tools().MAX_MESSAGE_CHARS
    assert "red" in result.message and "bell" in result.message  # the words stay
    for bad in ("\x1b", "\x07", "\x08", "]52;"):
        assert bad not in result.message
    flags = result.flags()
    if mode == "none":  # the jobs' policy, said in the result
        assert [f["kind"] for f in flags] == ["isolation"] and "without the per-job jail" in flags[0]["message"]
    else:
        assert flags == []


def test_a_tools_output_is_read_bounded(tmp_path):
    tool_jail = _tools()
    toolkit = _fake_toolkit(tmp_path)
    run = _run(tool_jail.ToolJail.of({"mode": "none"}, tmp_path), [str(toolkit / "bin" / "nvcc")], tmp_path)
    out = run.output()
    assert run.kept == tool_jail.MAX_OUTPUT_BYTES and run.dropped > 1_000_000
    assert len(out) < tool_jail.MAX_OUTPUT_BYTES + 100 and out.endswith("bytes of output dropped]")


def test_a_jail_that_cannot_be_entered_is_a_harness_error(tmp_path, monkeypatch):
    """The jail fails (here: its scratch is gone as it starts): nothing was compiled, so nothing
    is said about the candidate, and the compiler never ran outside the jail instead."""
    toolkit = _fake_toolkit(tmp_path)
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    monkeypatch.setenv("CXX", str(toolkit / "bin" / "cxx"))
    jail = job_jail("namespaces", tmp_path / "scratch-root")
    tool_jail = _tools()
    real_of = tool_jail.ToolJail.of
    monkeypatch.setattr(tool_jail.ToolJail, "of", classmethod(
        lambda cls, jail, scratch, keep_ro=None: real_of(jail, Path(scratch) / "gone", keep_ro)))
    result = precompile_mod.precompile(_many_extensions(1), tmp_path / "scratch-root" / "job" / "precompile",
                                       timeout=60, jail=jail)
    verdict = result.verdict()
    print("\n" + verdict.reason)
    assert verdict.status == Status.HARNESS_ERROR and "jail could not be entered" in verdict.reason
    assert "yyyy" not in verdict.reason  # the fake compiler never ran


# -- through the harness: `kernelagent eval --backend cuda --device cpu` ----------------------

def _attack(secret: Path, how: str) -> str:
    """relu_ok.py with the host file named in its sources: `static` names it as it is (absolute
    in cuda_sources, by `..` in cpp_sources); `macro` through a macro, past the static refusal
    (an #include for nvcc, a #line for the host compiler)."""
    src = read(RELU_OK)
    up = "../" * 12 + str(secret).lstrip("/")
    if how == "static":
        cuda, cpp = f'#include "{secret}"\n', f'#include \\"{up}\\"\\n'
    else:
        cuda = f'#define KA_P "{secret}"\n#include KA_P\n'
        cpp = f'#define KA_L \\"{up}\\"\\n#line 1 KA_L\\nint ka_f() {{ return undefined_thing; }}\\n'
    src = src.replace('CUDA_SRC = r"""\n', 'CUDA_SRC = r"""\n' + cuda, 1)
    return src.replace('CPP_SRC = "', 'CPP_SRC = "' + cpp, 1)


@needs_nvcc
@pytest.mark.parametrize("isolation", ["auto", "bwrap"])
def test_an_include_of_a_host_file_never_reaches_the_result(tmp_path, secrets_on_host, isolation):
    from kernelagent.harness import Evaluator
    from kernelagent.harness.jail import sandbox

    if isolation == "bwrap" and sandbox.bubblewrap_command(tmp_path) is None:
        pytest.skip("bubblewrap is not installed or cannot create namespaces here")
    secret = secrets_on_host["home"]
    content = secret.read_text().strip()
    with Evaluator(device="cpu", cache_dir=tmp_path / "cache", isolation=isolation) as ev:
        refused = ev.evaluate(RELU, _attack(secret, "static"), EvalConfig(backend="cuda"))
        jailed = ev.evaluate(RELU, _attack(secret, "macro"), EvalConfig(backend="cuda"))
    for result in (refused, jailed):
        print(f"\n[{isolation}] {result.status}: {result.reason}")
        text = json.dumps(result.to_dict())
        assert content not in text and "HUNTER2" not in text
        assert result.status == Status.COMPILE_ERROR and result.stage == "compile"
    assert "outside the build directory" in refused.reason and str(secret) in refused.reason
    assert refused.stage_seconds["nvcc"] < 5  # refused before any compiler ran
    assert "No such file or directory" in jailed.reason
