"""`kernelagent init`: write a kernelagent.toml.

From folders: every problem file in PROBLEMS with a kernel of the same stem in KERNELS
(`problems/relu.py` + `kernels/relu.py`) becomes a [[kernel]] entry. From a bench run
(`--from-bench RUN`): every problem the run solved gets its best kernel copied to
`kernels/<name>.py` and its problem to `problems/<name>.py`, so the repository is
self-contained; a copied kernel is checked against the hash the run evaluated.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kernelagent.ci.manifest import MANIFEST_NAME
from kernelagent.errors import UserError


@dataclass
class InitResult:
    manifest: Path
    pairs: list[tuple[str, str, str]]  # (name, problem, kernel), relative to the manifest
    skipped: list[str] = field(default_factory=list)  # why each left-out file was left out


def _is_problem(path: Path) -> bool:
    from kernelagent.problem import ProblemError, load_problem

    try:
        load_problem(path)
        return True
    except ProblemError:
        return False


def render_manifest(pairs: list[tuple[str, str, str]], header: str) -> str:
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines += ["", "# Regeneration (`kernelagent regenerate`): uncomment and set a model and budget.",
              '# model = "openai/gpt-4o"', "# max_turns = 10", "# max_cost = 5.0", "",
              "# Defaults for every kernel (each [[kernel]] may override them):",
              "# target_speedup = 1.0   # lower bound of the speedup vs TorchInductor",
              "# tolerance = 0.1        # allowed regression against the lock, same GPU model", ""]
    for name, problem, kernel in pairs:
        lines += ["[[kernel]]"]
        if name != Path(kernel).stem:
            lines.append(f'name = "{name}"')
        lines += [f'problem = "{problem}"', f'kernel = "{kernel}"', ""]
    return "\n".join(lines)


def _rel(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        raise UserError(f"{path} is outside {root}: manifest paths are relative to the manifest's folder") from None


def _target(root: Path, force: bool) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    manifest = root / MANIFEST_NAME
    if manifest.exists() and not force:
        raise UserError(f"{manifest} exists; pass --force to overwrite it")
    return manifest


def init_from_folders(root: Path, problems: Path, kernels: Path, *, force: bool = False) -> InitResult:
    for label, folder in (("problems", problems), ("kernels", kernels)):
        if not folder.is_dir():
            raise UserError(f"{label} folder {folder} not found")
    manifest = _target(root, force)
    pairs, skipped = [], []
    for problem in sorted(problems.glob("*.py")):
        kernel = kernels / problem.name
        if not kernel.is_file():
            skipped.append(f"{problem.name}: no kernel {kernel.name} in {kernels}")
        elif not _is_problem(problem):
            skipped.append(f"{problem.name}: not a problem (needs Model, get_inputs, get_init_inputs)")
        else:
            pairs.append((problem.stem, _rel(problem, root), _rel(kernel, root)))
    if not pairs:
        raise UserError(f"no problem in {problems} has a kernel of the same name in {kernels}")
    manifest.write_text(render_manifest(pairs, "Kernels checked by `kernelagent verify` (see kernelagent's "
                                                "docs, guides/ci.md)."), encoding="utf-8")
    return InitResult(manifest=manifest, pairs=pairs, skipped=skipped)


def init_from_bench(root: Path, run: str, *, store: str | None = None, force: bool = False) -> InitResult:
    from kernelagent.bench.discover import ProblemRef, find_candidates
    from kernelagent.bench.report import resolve_run
    from kernelagent.bench.store import open_store
    from kernelagent.problem import sha256_text

    store_path, run_id = resolve_run(run, store)
    with open_store(store_path) as db:
        info = db.run(run_id)
        if info is None:
            raise UserError(f"no run {run_id!r} in {store_path}")
        rows = db.problems(run_id)
        attempts = {(a["problem_key"], a["sample"]): a for a in db.attempts(run_id)}
    manifest = _target(root, force)
    spec = info["spec"] or {}
    pairs, skipped, copies = [], [], []
    for row in rows:
        record = row["record"] or {}
        key = row["key"]
        if not record.get("correct"):
            skipped.append(f"{key}: no correct kernel in the run")
            continue
        if spec.get("candidates"):
            ref = ProblemRef(path=Path(row["path"]), level=row["level"], name=row["name"])
            files = find_candidates(Path(spec["candidates"]), ref)
            best = record.get("best_sample")
            source = next((f for f in files if f.name == best or f"{f.parent.name}/{f.name}" == best), None)
            expected = (attempts.get((key, best)) or {}).get("candidate_sha256")
        else:
            source = Path(record["kernel"]) if record.get("kernel") else None
            expected = None
        if source is None or not source.is_file():
            skipped.append(f"{key}: its best kernel file is gone")
            continue
        text = source.read_text(encoding="utf-8")
        if expected and sha256_text(text) != expected:
            skipped.append(f"{key}: {source} changed since the run evaluated it")
            continue
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", key.replace("/", "_") if row["level"] else key)
        problem_dst, kernel_dst = root / "problems" / f"{name}.py", root / "kernels" / f"{name}.py"
        copies.append((Path(row["path"]), problem_dst, text, kernel_dst))
        pairs.append((name, _rel_new(problem_dst, root), _rel_new(kernel_dst, root)))
    if not pairs:
        raise UserError(f"run {run_id} has no correct kernel to take")
    for problem_src, problem_dst, text, kernel_dst in copies:
        if not problem_src.is_file():
            raise UserError(f"problem file {problem_src} of run {run_id} is gone")
        problem_dst.parent.mkdir(parents=True, exist_ok=True)
        kernel_dst.parent.mkdir(parents=True, exist_ok=True)
        if problem_src.resolve() != problem_dst.resolve():
            shutil.copyfile(problem_src, problem_dst)
        kernel_dst.write_text(text, encoding="utf-8")
    manifest.write_text(render_manifest(pairs, f"Kernels taken from bench run {run_id} "
                                               "(`kernelagent init --from-bench`)."), encoding="utf-8")
    return InitResult(manifest=manifest, pairs=pairs, skipped=skipped)


def _rel_new(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()
