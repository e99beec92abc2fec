"""`kernelagent.toml`: the kernels a repository keeps, and how CI checks and regenerates them.

    model = "openai/gpt-4o"          # regeneration: litellm model string (optional)
    max_turns = 10                   # regeneration budget, per kernel
    target_speedup = 1.0             # defaults for every kernel
    tolerance = 0.1

    [[kernel]]
    problem = "problems/relu.py"     # paths relative to the manifest
    kernel = "kernels/relu.py"
    name = "relu"                    # optional: default is the kernel file's stem
    target_speedup = 1.2             # optional, per kernel: target_speedup, tolerance, backend

Parsing only reads the TOML and checks types and paths: it never imports a problem. Every
mistake is a UserError with one line that names the file, the entry and the key.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelagent.errors import UserError

MANIFEST_NAME = "kernelagent.toml"
LOCK_NAME = "kernelagent.lock.json"
BACKENDS = ("triton", "cuda")
MODES = ("auto", "tools", "text")

# Top-level keys: regeneration (model and budget), harness settings, and per-kernel defaults.
_TOP: dict[str, tuple[type, ...]] = {
    "model": (str,), "api_base": (str,), "mode": (str,), "temperature": (int, float),
    "max_turns": (int,), "max_tokens": (int,), "max_cost": (int, float), "timeout": (int, float),
    "trials": (int,), "device": (str,), "strategy": (str,), "samples": (int,), "model_concurrency": (int,),
    "target_speedup": (int, float), "tolerance": (int, float), "backend": (str,),
    "kernel": (list,),
}
_PER_KERNEL: dict[str, tuple[type, ...]] = {
    "name": (str,), "problem": (str,), "kernel": (str,),
    "target_speedup": (int, float), "tolerance": (int, float), "backend": (str,),
}


@dataclass(frozen=True)
class KernelEntry:
    name: str
    problem: Path  # absolute
    kernel: Path  # absolute
    problem_rel: str  # as written in the manifest (what the lock and the reports show)
    kernel_rel: str
    target_speedup: float = 1.0  # vs TorchInductor (else eager); 0 turns the target off
    tolerance: float = 0.1  # allowed fractional regression against the lock's speedup
    backend: str = "triton"


@dataclass
class Manifest:
    path: Path
    root: Path
    kernels: list[KernelEntry]
    model: str | None = None
    api_base: str | None = None
    mode: str = "auto"
    temperature: float | None = None
    max_turns: int = 10
    max_tokens: int | None = None
    max_cost: float | None = None
    timeout: float | None = None
    trials: int = 5
    device: str = "auto"
    strategy: str = "single"  # the regeneration's search (kernelagent/search)
    samples: int = 1
    model_concurrency: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK_NAME

    def select(self, names: list[str] | None) -> list[KernelEntry]:
        """The entries named (all when `names` is empty); an unknown name is bad input."""
        if not names:
            return list(self.kernels)
        known = {k.name: k for k in self.kernels}
        wanted: list[str] = []
        for item in names:
            wanted += [n.strip() for n in item.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise UserError(f"{self.path}: no kernel named {', '.join(unknown)} "
                            f"(the manifest has: {', '.join(known)})")
        return [known[n] for n in dict.fromkeys(wanted)]


def _toml_loads(text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10 only
        try:
            import tomli as tomllib
        except ImportError:
            raise UserError("reading kernelagent.toml on Python 3.10 needs `tomli` "
                            "(pip install tomli)") from None
    return tomllib.loads(text)


def find_manifest(path: str | Path | None) -> Path:
    """PATH may be the manifest itself or the folder that holds it (default: the current one)."""
    target = Path(path) if path else Path.cwd()
    if target.is_dir():
        target = target / MANIFEST_NAME
    if not target.is_file():
        raise UserError(f"no manifest at {target} (create one with `kernelagent init`)")
    return target.resolve()


def _check_type(where: str, key: str, value: Any, kinds: tuple[type, ...]) -> None:
    # TOML booleans are ints to Python: refuse them where a number is meant.
    if isinstance(value, bool) or not isinstance(value, kinds):
        names = {k.__name__ for k in kinds}
        expected = "a number" if "float" in names else {"str": "a string", "int": "an integer",
                                                        "list": "an array of tables"}[kinds[0].__name__]
        raise UserError(f"{where}: `{key}` must be {expected} (got {value!r})")


def _number(where: str, key: str, value: Any, *, minimum: float = 0.0) -> float:
    if value < minimum:
        raise UserError(f"{where}: `{key}` must be at least {minimum:g} (got {value!r})")
    return float(value)


def load_manifest(path: str | Path | None = None) -> Manifest:
    file = find_manifest(path)
    try:
        data = _toml_loads(file.read_text(encoding="utf-8"))
    except UserError:
        raise
    except UnicodeDecodeError as exc:
        raise UserError(f"{file}: not UTF-8 text ({exc.reason})") from None
    except Exception as exc:  # tomllib.TOMLDecodeError: its message has the line and column
        raise UserError(f"{file}: not valid TOML: {exc}") from None
    where = str(file)
    for key, value in data.items():
        if key not in _TOP:
            raise UserError(f"{where}: unknown key `{key}` (known: {', '.join(sorted(_TOP))})")
        _check_type(where, key, value, _TOP[key])
    root = file.parent
    defaults = {
        "target_speedup": _number(where, "target_speedup", data.get("target_speedup", 1.0)),
        "tolerance": _number(where, "tolerance", data.get("tolerance", 0.1)),
        "backend": data.get("backend", "triton"),
    }
    if defaults["backend"] not in BACKENDS:
        raise UserError(f"{where}: `backend` must be triton or cuda (got {defaults['backend']!r})")
    entries = data.get("kernel") or []
    if not entries:
        raise UserError(f"{where}: no kernels: add a [[kernel]] table with `problem` and `kernel`")
    kernels: list[KernelEntry] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries, 1):
        at = f"{where}: kernel #{index}"
        if not isinstance(entry, dict):
            raise UserError(f"{at}: each kernel must be a [[kernel]] table")
        for key, value in entry.items():
            if key not in _PER_KERNEL:
                raise UserError(f"{at}: unknown key `{key}` (known: {', '.join(sorted(_PER_KERNEL))})")
            _check_type(at, key, value, _PER_KERNEL[key])
        for key in ("problem", "kernel"):
            if key not in entry:
                raise UserError(f"{at}: `{key}` is missing (a path relative to the manifest)")
        problem, kernel = root / entry["problem"], root / entry["kernel"]
        for key, p in (("problem", problem), ("kernel", kernel)):
            if not p.is_file():
                raise UserError(f"{at}: {key} file {entry[key]} not found (looked at {p})")
        name = entry.get("name") or Path(entry["kernel"]).stem
        if name in seen:
            raise UserError(f"{at}: the name `{name}` is already used by kernel #{seen[name]}; "
                            "give one of them a `name`")
        seen[name] = index
        backend = entry.get("backend", defaults["backend"])
        if backend not in BACKENDS:
            raise UserError(f"{at}: `backend` must be triton or cuda (got {backend!r})")
        kernels.append(KernelEntry(
            name=name, problem=problem.resolve(), kernel=kernel.resolve(),
            problem_rel=Path(entry["problem"]).as_posix(), kernel_rel=Path(entry["kernel"]).as_posix(),
            target_speedup=_number(at, "target_speedup", entry.get("target_speedup", defaults["target_speedup"])),
            tolerance=_number(at, "tolerance", entry.get("tolerance", defaults["tolerance"])),
            backend=backend))
    mode = data.get("mode", "auto")
    if mode not in MODES:
        raise UserError(f"{where}: `mode` must be one of {', '.join(MODES)} (got {mode!r})")
    for key in ("max_turns", "max_tokens", "trials", "samples", "model_concurrency"):
        if key in data and data[key] < 1:
            raise UserError(f"{where}: `{key}` must be at least 1 (got {data[key]!r})")
    from kernelagent.search.strategies import STRATEGIES

    strategy, samples = data.get("strategy", "single"), data.get("samples", 1)
    if strategy not in STRATEGIES:
        raise UserError(f"{where}: `strategy` must be one of {', '.join(STRATEGIES)} (got {strategy!r})")
    if strategy == "single" and samples != 1:
        raise UserError(f"{where}: `samples` above 1 needs a search `strategy` (best-of-n, beam or evolve)")
    return Manifest(
        path=file, root=root, kernels=kernels, model=data.get("model"), api_base=data.get("api_base"),
        mode=mode, temperature=data.get("temperature"), max_turns=data.get("max_turns", 10),
        max_tokens=data.get("max_tokens"),
        max_cost=_number(where, "max_cost", data["max_cost"]) if "max_cost" in data else None,
        timeout=_number(where, "timeout", data["timeout"], minimum=1.0) if "timeout" in data else None,
        trials=data.get("trials", 5), device=data.get("device", "auto"), strategy=strategy, samples=samples,
        model_concurrency=data.get("model_concurrency"))
