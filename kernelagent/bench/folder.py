"""A bench run's folder (reports, run.json, agent outputs), decided and checked before anything
about the run is recorded in the store.

- `--out DIR` must be a folder (or a path one can be made at); a folder whose run.json names
  another run, or the same run id in another store, is refused unless `--force` (as `optimize`
  refuses an --out that holds a run).
- Without --out, a run keeps the folder the store recorded for it; a new run gets
  runs/bench/<run id>, or runs/bench/<run id>-<store hash> where that folder belongs to a run
  of the same settings over another store (the two never share one folder).
- A recorded folder that is no longer usable (a file there: a run stuck by an older version
  that accepted `--out FILE`) is one line naming --out, never an internal error.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from kernelagent.errors import UserError
from kernelagent.files import check_folder

REPORT_FILES = ("run.json", "summary.json", "problems.csv", "report.html")


def owner(folder: Path) -> tuple[str, str] | None:
    """(run id, store path) of the bench run whose run.json is in `folder`, if any."""
    try:
        data = json.loads((folder / "run.json").read_text(encoding="utf-8"))
        return str(data["run_id"]), str(data["store"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_folder(*, run_id: str, store_path: Path, explicit: str | None, recorded: str | None,
               force: bool = False) -> Path:
    """The run's folder, created and checked; a UserError (one line) where it cannot be used."""
    me = (run_id, str(Path(store_path).resolve()))
    if explicit:
        out = Path(explicit)
        check_folder(out, f"--out {out}")
        held = owner(out)
        if held is not None and held != me:
            if not force:
                raise UserError(f"--out {out} already holds bench run {held[0]} (store {held[1]}): pass --force "
                                "to replace its report, or choose another folder")
            for name in REPORT_FILES:
                (out / name).unlink(missing_ok=True)
    elif recorded:
        out = Path(recorded)
        check_folder(out, f"the run's folder {out} (recorded in the store)", ": give --out DIR")
        if out.exists() and (held := owner(out)) is not None and held != me:
            raise UserError(f"the run's folder {out} (recorded in the store) now holds bench run {held[0]} "
                            f"(store {held[1]}): give --out DIR")
    else:
        out = Path("runs") / "bench" / run_id
        held = owner(out)
        if held is not None and held != me:
            out = out.with_name(f"{run_id}-{hashlib.sha256(me[1].encode()).hexdigest()[:8]}")
        check_folder(out, f"the default folder {out}", ": give --out DIR")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the run's folder {out}: {exc.strerror or exc}; give --out DIR") from None
    return out
