"""Find the problems of a benchmark directory.

Layouts understood:
  - levels: DIR/level1/*.py, DIR/level2/*.py, ... (KernelBench's `KernelBench/levelN/` and our
    `benchmarks/levelN/`); a KernelBench checkout's root works too (its problems sit under
    DIR/KernelBench/levelN/);
  - one level: DIR is itself a `levelN` folder;
  - flat: DIR/*.py, with no level folders.
Only files that parse as KernelBench problems (Model, get_inputs, get_init_inputs) are
problems; helper scripts next to them are skipped. Parsing only: nothing is imported.

This is the one discovery of the project: `bench`, `dataset prompts`, `export sft`, the RL
environments, the reward and the service all name problems with `problem_key` and split
them with `problem_split`, so an id and a side never depend on which folder was given:

  - id: "levelN/<stem>" when the file sits in a `levelN` folder, else the stem;
  - split: a hash of (seed, the problem's source hash), so a problem keeps its side when it
    is renamed, moved, or built from another folder, and copies of one source go together.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

from kernelagent.errors import UserError
from kernelagent import pyast

LEVEL_DIR = re.compile(r"^level(\d+)$")
# Levels run only when --levels names them: KernelBench's level 4 builds Hugging Face models
# (transformers, and weights from the hub), which a plain run should not reach for.
OPT_IN_LEVELS = frozenset({"level4"})
DEFAULT_SPLIT = 0.8  # train fraction used when none is given (dataset prompts, export sft)
DEFAULT_SEED = 0


def problem_key(path: str | Path) -> str:
    """The problem's id: "level1/1_relu" for .../level1/1_relu.py, else the file's stem."""
    path = Path(path)
    level = path.parent.name
    return f"{level}/{path.stem}" if LEVEL_DIR.match(level) else path.stem


def split_fraction(source_sha256: str, seed: int = DEFAULT_SEED) -> float:
    """Where a problem falls in [0, 1): a hash of the seed and the problem's content hash."""
    import hashlib

    digest = hashlib.sha256(f"{seed}:{source_sha256}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64


def problem_split(source_sha256: str, train_fraction: float = DEFAULT_SPLIT,
                  seed: int = DEFAULT_SEED) -> str:
    """"train" or "test" for a problem, by its content hash (sha256 of its source text)."""
    return "train" if split_fraction(source_sha256, seed) < train_fraction else "test"


@dataclass(frozen=True)
class ProblemRef:
    path: Path
    level: str | None  # "level1", or None in a flat layout
    name: str  # the file's stem

    @property
    def key(self) -> str:
        """Unique within a run: "level1/1_relu", or "1_relu" in a flat layout."""
        return problem_key(self.path)


def _natural(text: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _is_problem(path: Path) -> bool:
    from kernelagent.problem import REQUIRED_PROBLEM_NAMES, top_level_names

    import ast

    try:
        tree = pyast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return False
    return all(name in top_level_names(tree) for name in REQUIRED_PROBLEM_NAMES)


def parse_levels(spec: str | None) -> set[str] | None:
    """'1,3' or 'level1,level3' -> {'level1', 'level3'}; None/'' -> None (all)."""
    if spec is None or not spec.strip():
        return None
    levels = set()
    for part in spec.split(","):
        part = part.strip().lower()
        if part.isdigit():
            levels.add(f"level{int(part)}")
        elif LEVEL_DIR.match(part):
            levels.add(part)
        else:
            raise UserError(f"--levels takes level numbers like 1,2 (or level1,level2), got {spec!r}")
    return levels


def level_dirs(root: Path) -> list[Path]:
    found = [p for p in root.iterdir() if p.is_dir() and LEVEL_DIR.match(p.name)]
    if not found and (root / "KernelBench").is_dir():  # a KernelBench checkout's root
        found = [p for p in (root / "KernelBench").iterdir() if p.is_dir() and LEVEL_DIR.match(p.name)]
    return sorted(found, key=lambda p: int(LEVEL_DIR.match(p.name).group(1)))


def check_root(root: str | Path) -> Path:
    """A benchmark directory that exists and is a directory, else one line saying which."""
    root = Path(root)
    if root.is_file():
        raise UserError(f"DIR must be a directory of problem files, and {root} is a file "
                        "(to evaluate one problem: kernelagent eval PROBLEM CANDIDATE)")
    if not root.is_dir():
        raise UserError(f"benchmark directory not found: {root}")
    return root


def discover(root: str | Path, levels: str | set[str] | None = None, pattern: str | None = None,
             limit: int | None = None) -> list[ProblemRef]:
    """The problems under `root`, in a stable order (level, then natural file order). Without
    `levels`, every level except the opt-in ones (OPT_IN_LEVELS)."""
    root = Path(root)
    wanted = parse_levels(levels) if isinstance(levels, str) or levels is None else set(levels)
    if root.is_file() and root.suffix == ".py":  # one problem file
        if not _is_problem(root):
            raise UserError(f"not a problem file (it needs Model, get_inputs and get_init_inputs): {root}")
        level = root.parent.name if LEVEL_DIR.match(root.parent.name) else None
        ref = ProblemRef(path=root.resolve(), level=level, name=root.stem)
        return [ref] if wanted is None or level in wanted else []
    root = check_root(root)
    if LEVEL_DIR.match(root.name):
        groups = [(root.name, root)]
    else:
        dirs = level_dirs(root)
        groups = [(d.name, d) for d in dirs] if dirs else [(None, root)]
    problems: list[ProblemRef] = []
    for level, folder in groups:
        if (wanted is not None and level not in wanted) or (wanted is None and level in OPT_IN_LEVELS):
            continue
        for path in sorted(folder.glob("*.py"), key=lambda p: _natural(p.name)):
            if path.name.startswith("_") or not _is_problem(path):
                continue
            ref = ProblemRef(path=path.resolve(), level=level, name=path.stem)
            if pattern and not (fnmatch.fnmatch(ref.key, pattern) or fnmatch.fnmatch(ref.name, pattern)):
                continue
            problems.append(ref)
    if limit is not None:
        problems = problems[:limit]
    return problems


def find_candidates(cdir: Path, ref: ProblemRef) -> list[Path]:
    """Candidate files for a problem: CDIR/<stem>/*.py (samples) or CDIR/<stem>.py, each
    also looked up under CDIR/<level>/ first (the layout of benchmarks/solutions/)."""
    bases = ([cdir / ref.level] if ref.level else []) + [cdir]
    for base in bases:
        folder = base / ref.name
        if folder.is_dir():
            samples = sorted((p for p in folder.glob("*.py") if p.is_file()), key=lambda p: _natural(p.name))
            if samples:
                return samples
        single = base / f"{ref.name}.py"
        if single.is_file():
            return [single]
    return []
