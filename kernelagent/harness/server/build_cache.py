"""The CUDA build cache (trusted side): only the harness server reads and writes it.

After a job, `publish` copies the .so files that the job built into the cache, with the sha256
of each file's bytes. Before a job, `stage` copies the entries of that candidate into the job's
scratch directory, checking each file's hash first: the candidate's process never sees the
cache itself (it is not mounted in its sandbox), only its own copy."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from pathlib import Path

from kernelagent.harness.cuda_source import MANIFEST

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
            # The hash of what the server copied: `stage` hands a job only bytes that match it.
            (tmp / "sha256").write_text(_sha256(tmp / f"{name}.so"))
            os.replace(tmp, final)
            added += 1
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return added


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def stage(cache_dir: str | Path | None, candidate_sha: str, target: Path, max_bytes: int = 1 << 30) -> int:
    """Copy this candidate's cached builds into `target` (inside the job's scratch directory),
    each only if its bytes match the hash recorded when the server published it. Returns how
    many entries were staged. The candidate's process reads builds from this copy only."""
    if not cache_dir or not candidate_sha:
        return 0
    root = Path(cache_dir) / candidate_sha[:32]
    if not root.is_dir():
        return 0
    staged = 0
    total = 0
    for entry in sorted(root.iterdir())[:16]:
        if not re.fullmatch(r"[0-9a-f]{64}", entry.name) or entry.is_symlink() or not entry.is_dir():
            continue
        try:
            recorded = (entry / "sha256").read_text().strip()
            files = [f for f in entry.iterdir() if f.suffix == ".so" and f.is_file() and not f.is_symlink()]
        except OSError:
            continue
        if len(files) != 1 or not re.fullmatch(r"[0-9a-f]{64}", recorded):
            continue
        so = files[0]
        total += so.stat().st_size
        if total > max_bytes or _sha256(so) != recorded:
            continue  # tampered with, or too much: built afresh by the job instead
        (target / entry.name).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(so, target / entry.name / so.name)
        staged += 1
    return staged


def arch_of(capability: str | None) -> str:
    """'9.0' -> '9.0' for TORCH_CUDA_ARCH_LIST (and the cache key)."""
    return capability or ""
