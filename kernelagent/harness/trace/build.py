"""Build the kernel tracer (tracer.c, a CUPTI injection library) on first use, into the harness
cache (issue 55).

`library()` finds CUPTI's headers and library and cuda.h, builds tracer.c with the host C
compiler (`cc -shared -fPIC -O2`, libcupti linked with an rpath) into
`<cache>/trace/<key>/libkernelagent_trace.so`, keyed by the source's sha, the CUPTI library and
headers, cuda.h and the compiler, and renames the finished folder into place (two servers
building at once both end with one whole library). It returns the library's path, or an
`Unavailable` with the reason: it never raises, since a tracer that cannot load means the
evidence falls back to Nsight Compute and the result says why.

Where CUPTI is looked for, in order (the first with both `cupti.h` and `libcupti.so*`): the
`nvidia` wheels torch depends on (`nvidia/cu13/` on CUDA 13 wheels, `nvidia/cuda_cupti/` on
CUDA 12 wheels: the libcupti torch itself loads), `$CUDA_HOME/extras/CUPTI`,
`/usr/local/cuda/extras/CUPTI`, then Triton's bundled copy (`triton/backends/nvidia`). cuda.h:
beside cupti.h, `$CUDA_HOME/include`, `/usr/local/cuda/include`, the nvidia wheels, Triton's.
Runs only in the trusted server (it compiles our own package data, never candidate text)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kernelagent import settings

SOURCE = Path(__file__).with_name("tracer.c")
LIB_NAME = "libkernelagent_trace.so"
SONAME = LIB_NAME
FORMAT = 1
BUILD_TIMEOUT_S = 120.0
CFLAGS = ("-shared", "-fPIC", "-O2", "-fvisibility=hidden")
SYSTEM_CUDA = ("/usr/local/cuda",)  # tried after $CUDA_HOME and $CUDA_PATH


@dataclass(frozen=True)
class Unavailable:
    """Why the tracer cannot be had here (one line, for the result)."""
    reason: str

    def __bool__(self) -> bool:
        return False


@dataclass(frozen=True)
class Toolchain:
    compiler: str
    compiler_version: str
    cupti_include: Path
    cupti_lib: Path
    cuda_include: Path
    structs: tuple[tuple[str, str], ...]  # (macro, newest record struct) for tracer.c


def _site_dirs(roots: Iterable[str | Path] | None) -> list[Path]:
    seen: list[Path] = []
    for entry in (sys.path if roots is None else roots):
        try:
            path = Path(entry)
            if path.is_dir() and path not in seen:
                seen.append(path)
        except (OSError, ValueError):
            continue
    return seen


def _cupti_lib(lib_dir: Path) -> Path | None:
    """libcupti.so.<major> (the soname torch loads) before libcupti.so, else any libcupti.so.*."""
    try:
        names = sorted(p.name for p in lib_dir.iterdir() if p.name.startswith("libcupti.so"))
    except OSError:
        return None
    majors = [n for n in names if re.fullmatch(r"libcupti\.so\.\d+", n)]
    for name in majors + (["libcupti.so"] if "libcupti.so" in names else []) + names:
        if (lib_dir / name).is_file():
            return lib_dir / name
    return None


def cupti_candidates(site_dirs: list[Path], env: Mapping[str, str]) -> list[tuple[Path, Path]]:
    """(include dir, lib dir) pairs, in the order they are tried."""
    pairs: list[tuple[Path, Path]] = []
    for site in site_dirs:
        nvidia = site / "nvidia"
        for sub in ("cu13", "cuda_cupti", "cu12"):
            pairs.append((nvidia / sub / "include", nvidia / sub / "lib"))
    for home in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), *SYSTEM_CUDA):
        if home:
            pairs += [(Path(home) / "extras" / "CUPTI" / "include", Path(home) / "extras" / "CUPTI" / lib)
                      for lib in ("lib64", "lib")]
    for site in site_dirs:
        nv = site / "triton" / "backends" / "nvidia"
        pairs.append((nv / "include", nv / "lib" / "cupti"))
    return pairs


def cuda_h_candidates(cupti_include: Path, site_dirs: list[Path], env: Mapping[str, str]) -> list[Path]:
    dirs = [cupti_include]
    dirs += [Path(h) / "include" for h in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), *SYSTEM_CUDA) if h]
    for site in site_dirs:
        dirs += [site / "nvidia" / sub / "include" for sub in ("cu13", "cuda_runtime", "cu12")]
        dirs.append(site / "triton" / "backends" / "nvidia" / "include")
    return dirs


def newest_structs(activity_h: Path) -> tuple[tuple[str, str], ...]:
    """The newest versioned record structs cupti_activity.h defines: the library fills the
    newest layout its own headers know, so tracer.c reads through that one."""
    text = activity_h.read_text(encoding="latin-1")
    found = []
    for macro, stem in (("KA_KERNEL_T", "Kernel"), ("KA_MEMCPY_T", "Memcpy"), ("KA_MEMSET_T", "Memset")):
        versions = [int(v or 0) for v in re.findall(rf"}}\s*CUpti_Activity{stem}(\d*)\s*;", text)]
        if not versions:
            raise ValueError(f"{activity_h} defines no CUpti_Activity{stem} record")
        best = max(versions)
        found.append((macro, f"CUpti_Activity{stem}{best if best else ''}"))
    return tuple(found)


def find_toolchain(*, roots: Iterable[str | Path] | None = None,
                   env: Mapping[str, str] | None = None) -> Toolchain | Unavailable:
    env = os.environ if env is None else env
    if not sys.platform.startswith("linux"):
        return Unavailable(f"the tracer needs Linux (this is {sys.platform})")
    sites = _site_dirs(roots)
    cupti = None
    for include, lib_dir in cupti_candidates(sites, env):
        if (include / "cupti.h").is_file() and (include / "cupti_activity.h").is_file():
            lib = _cupti_lib(lib_dir)
            if lib is not None:
                cupti = (include, lib)
                break
    if cupti is None:
        return Unavailable("no CUPTI found (cupti.h with libcupti.so in the nvidia cupti wheel, "
                           "CUDA_HOME/extras/CUPTI, /usr/local/cuda/extras/CUPTI or Triton's bundle)")
    # cupti.h includes cuda.h and device_types.h, which includes crt/host_defines.h: the CUPTI
    # wheel's include folder can hold the first two without crt/ (torch 2.11's nvidia/cu13).
    cuda_include = next((d for d in cuda_h_candidates(cupti[0], sites, env)
                         if (d / "cuda.h").is_file() and (d / "crt" / "host_defines.h").is_file()), None)
    if cuda_include is None:
        return Unavailable("no cuda.h with crt/host_defines.h found (CUDA_HOME/include, "
                           "/usr/local/cuda/include, the nvidia wheels or Triton's bundled headers)")
    compiler = env.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return Unavailable("no C compiler (cc or gcc) on PATH to build the tracer")
    try:
        run = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
        version = (run.stdout or run.stderr).splitlines()[0].strip() if run.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError, IndexError):
        version = ""
    if not version:
        return Unavailable(f"the C compiler {compiler} does not answer --version")
    try:
        structs = newest_structs(cupti[0] / "cupti_activity.h")
    except (OSError, ValueError) as exc:
        return Unavailable(f"CUPTI headers not usable: {exc}")
    return Toolchain(compiler=compiler, compiler_version=version, cupti_include=cupti[0],
                     cupti_lib=cupti[1], cuda_include=cuda_include, structs=structs)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_key(tools: Toolchain, source: Path = SOURCE) -> str:
    lib = tools.cupti_lib.resolve()
    parts = {
        "format": FORMAT, "source": _sha(source), "compiler": tools.compiler_version,
        "cflags": CFLAGS, "structs": tools.structs,
        "cupti_lib": [str(lib), lib.stat().st_size],
        "cupti_version_h": _sha(tools.cupti_include / "cupti_version.h")
        if (tools.cupti_include / "cupti_version.h").is_file() else None,
        "cuda_h": _sha(tools.cuda_include / "cuda.h"),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def compile_command(tools: Toolchain, out: Path, source: Path = SOURCE) -> list[str]:
    lib_dir = tools.cupti_lib.parent.resolve()
    return [tools.compiler, *CFLAGS, *(f"-D{m}={s}" for m, s in tools.structs),
            f"-I{tools.cupti_include}", f"-I{tools.cuda_include}", str(source), "-o", str(out),
            str(tools.cupti_lib), f"-Wl,-rpath,{lib_dir}", f"-Wl,-soname,{SONAME}", "-ldl", "-lpthread"]


def default_cache_dir(env: Mapping[str, str]) -> Path:
    # The same root as the baseline cache (caller/baseline_cache.default_cache_dir).
    named = settings.get("KERNELAGENT_CACHE_DIR", env)
    if named is not None:
        return named
    return Path(env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "kernelagent"


def _cached(final: Path) -> Path | None:
    lib, digest = final / LIB_NAME, final / "sha256"
    try:
        if lib.is_file() and not lib.is_symlink() and digest.read_text().strip() == _sha(lib):
            return lib
    except OSError:
        return None
    return None


def library(*, cache_dir: str | Path | None = None, roots: Iterable[str | Path] | None = None,
            env: Mapping[str, str] | None = None, source: Path = SOURCE) -> Path | Unavailable:
    """The built tracer's path (building it on first use), or why there is none. Never raises."""
    try:
        env = os.environ if env is None else env
        tools = find_toolchain(roots=roots, env=env)
        if isinstance(tools, Unavailable):
            return tools
        root = (Path(cache_dir) if cache_dir else default_cache_dir(env)) / "trace"
        final = root / build_key(tools, source)
        if (hit := _cached(final)) is not None:
            return hit
        if final.exists():  # a library whose bytes no longer match its hash: build it again
            shutil.rmtree(final, ignore_errors=True)
        tmp = root / f".tmp-{uuid.uuid4().hex}"
        tmp.mkdir(parents=True)
        try:
            run = subprocess.run(compile_command(tools, tmp / LIB_NAME, source), capture_output=True,
                                 text=True, timeout=BUILD_TIMEOUT_S)
            if run.returncode != 0:
                tail = " ".join((run.stderr or run.stdout).split())[-400:]
                return Unavailable(f"building the tracer failed ({tools.compiler}): {tail}")
            (tmp / "sha256").write_text(_sha(tmp / LIB_NAME))
            (tmp / "toolchain.json").write_text(json.dumps({
                "compiler": tools.compiler_version, "cupti_lib": str(tools.cupti_lib),
                "cupti_include": str(tools.cupti_include), "cuda_include": str(tools.cuda_include),
                "structs": dict(tools.structs)}, indent=1))
            try:
                os.replace(tmp, final)
            except OSError:  # another server renamed its build first: use that one
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return _cached(final) or Unavailable(f"the built tracer at {final} does not match its hash")
    except subprocess.TimeoutExpired:
        return Unavailable(f"building the tracer took over {BUILD_TIMEOUT_S:.0f} s")
    except Exception as exc:  # noqa: BLE001 - never raise: the evidence falls back and says why
        return Unavailable(f"the tracer could not be built: {type(exc).__name__}: {exc}")


class ServerBuild:
    """for_server's answer, worked out in a thread from the server's first moments: with empty
    caches the build (a C compiler run) then goes on beside the server's imports of torch instead
    of after them, off a cold `eval`'s path (issue 59). `result` waits for it; the server asks
    before it forks any job's process, so no fork meets the thread. Where CUDA was not expected
    nothing is started, and `result` answers as for_server does."""

    def __init__(self, *, cuda: bool):
        self._answer: dict[str, str] | None = None
        self.seconds = 0.0
        self._thread: threading.Thread | None = None
        if cuda:
            self._thread = threading.Thread(target=self._run, name="kernelagent-trace-build", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        try:
            self._answer = for_server(cuda=True)
        except Exception as exc:  # noqa: BLE001 - for_server never raises; a bug of ours says why
            self._answer = {"unavailable": f"the tracer's build failed: {type(exc).__name__}: {exc}"}
        self.seconds = time.monotonic() - started

    def result(self, *, cuda: bool) -> dict[str, str]:
        """What for_server(cuda=cuda) says, the thread's answer where it built one."""
        if self._thread is not None:
            self._thread.join()
        if cuda and self._answer is not None:
            return self._answer
        return for_server(cuda=cuda)


OFF_ENV = "KERNELAGENT_TRACE"  # "0": no tracer (the evidence is Nsight Compute's, as before issue 55)


def for_server(*, cuda: bool, cache_dir: str | Path | None = None,
               env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a server's fingerprint says of the tracer, decided once at its start:
    {"library": path} where its jobs' processes are traced, else {"unavailable": reason}."""
    env = os.environ if env is None else env
    if not cuda:
        return {"unavailable": "no CUDA device"}
    if not settings.get(OFF_ENV, env):
        return {"unavailable": f"turned off ({OFF_ENV}=0)"}
    found = library(cache_dir=cache_dir, env=env)
    return {"library": str(found)} if isinstance(found, Path) else {"unavailable": found.reason}
