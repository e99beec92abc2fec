"""The CUDA build hook, installed in the candidate's process before the candidate is imported
(backend "cuda"): wraps torch's load_inline/load, checks their arguments, builds in the job's own
scratch directory, and loads a cached build only from the job's private copy of the cache, which
the server staged after checking each entry's content hash (server/build_cache.py)."""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any, Callable

from kernelagent.harness.cuda_source import (MANIFEST, Chunk, CudaBuildError, ExtensionSpec, check_flags,
                                             check_includes, compact_errors, demangle, generated_files,
                                             global_kernel_names)

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
        self.cache_dir = Path(cache_dir) if cache_dir else None  # the job's staged, verified copy
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
        functions = kwargs.get("functions")  # names, or names to docstrings: both go into torch's main.cpp
        bound = [*functions, *functions.values()] if isinstance(functions, dict) else _function_names(functions)
        for kind, texts in (("cpp_sources", cpp_list), ("cuda_sources", cuda_list), ("functions", bound or [])):
            for text in texts:
                check_includes(kind, text)
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
            check_includes(f"load(): {Path(src).name}", text)
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
