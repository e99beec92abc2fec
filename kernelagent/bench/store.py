"""The bench store: one SQLite file (stdlib sqlite3) holding runs, problems, attempts and
evaluation results.

- `evaluations` is a content-addressed cache: one row per evaluation key, the SHA-256 of the
  problem's content, the candidate's content, every harness setting (EvalConfig) and the
  environment fingerprint (GPU, driver, torch, triton, python, platform, kernelagent). A key
  that is there is never evaluated again, by this run or any other using the same store.
- `evaluation_log` gets one row per evaluation the harness actually performed (a cache hit
  adds none), so "how many evaluations did this run do" is a query.
- `attempts` links a run's problem to the evaluations it used (a sample in --candidates
  mode; each harness call of the agent in agent mode).
- Every write is one transaction (BEGIN IMMEDIATE ... COMMIT); the database runs in WAL
  mode, so a process killed with SIGKILL leaves every committed row and nothing half-written.
- One connection per Store, shared by the threads of one process under a lock; other
  processes may use the same file (they wait up to `busy_timeout` for the write lock).

Default location: $KERNELAGENT_CACHE_DIR/bench.sqlite (else $XDG_CACHE_HOME/kernelagent, else
~/.cache/kernelagent), so that the cache is shared by every run of the user; `--store PATH`
puts it anywhere else (for example inside a run directory).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
# PRAGMA application_id of a kernelagent store ("KAgS"), set when the store is made: a SQLite file
# that holds tables but not ours (another program's database) is refused, never added to.
APPLICATION_ID = 0x4B416753
# A store up to this size is read through by PRAGMA quick_check when opened (a damaged page is one
# line then, not an internal error mid-run); a larger one is checked where it is used.
QUICK_CHECK_MAX_BYTES = 1 << 30

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    mode TEXT NOT NULL,                 -- 'candidates' | 'agent'
    status TEXT NOT NULL,               -- 'running' | 'finished' | 'interrupted' | 'failed'
    spec TEXT NOT NULL,                 -- JSON: what the run does (enough to resume it)
    out_dir TEXT,
    fingerprint TEXT,                   -- JSON: the environment of the latest session
    created REAL NOT NULL,
    updated REAL NOT NULL,
    wall_s REAL NOT NULL DEFAULT 0,     -- summed over sessions (resumes)
    sessions INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS problems (
    run_id TEXT NOT NULL REFERENCES runs(id),
    key TEXT NOT NULL,                  -- 'level1/1_relu'
    position INTEGER NOT NULL,
    level TEXT,
    name TEXT NOT NULL,
    path TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',   -- 'pending' | 'done' | 'error'
    record TEXT,                        -- JSON: the problem's outcome (see runner.py)
    started REAL,
    finished REAL,
    PRIMARY KEY (run_id, key)
);
CREATE TABLE IF NOT EXISTS attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    problem_key TEXT NOT NULL,
    sample TEXT NOT NULL,               -- candidate file name, or 'eval-N' in agent mode
    candidate_sha256 TEXT NOT NULL,
    eval_key TEXT,                      -- NULL when nothing was evaluated (e.g. missing)
    reused INTEGER NOT NULL DEFAULT 0,  -- 1: the result came from the store, no evaluation
    summary TEXT NOT NULL,              -- JSON: status, passed, compiled, speedups, ...
    created REAL NOT NULL,
    UNIQUE (run_id, problem_key, sample)
);
CREATE TABLE IF NOT EXISTS evaluations (
    key TEXT PRIMARY KEY,
    problem_sha256 TEXT NOT NULL,
    candidate_sha256 TEXT NOT NULL,
    settings_sha256 TEXT NOT NULL,
    env_sha256 TEXT NOT NULL,
    status TEXT NOT NULL,
    passed INTEGER NOT NULL,
    result TEXT NOT NULL,               -- JSON: EvalResult.to_dict()
    seconds REAL,
    device TEXT,
    run_id TEXT,                        -- the run that performed it
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS evaluation_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    run_id TEXT,
    device TEXT,
    seconds REAL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS attempts_by_problem ON attempts (run_id, problem_key);
CREATE INDEX IF NOT EXISTS log_by_run ON evaluation_log (run_id);
"""

# Fingerprint fields that describe the environment (a GPU's index does not: every server
# sees its GPU as cuda:0, and two identical GPUs give identical results).
ENV_FIELDS = ("python", "torch", "torch_cuda", "triton", "platform", "cuda", "gpu_name", "capability",
              "sm_count", "l2_bytes", "mem_bytes", "driver")


def default_store_path() -> Path:
    from kernelagent.harness.caller.baseline_cache import default_cache_dir

    return default_cache_dir() / "bench.sqlite"


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def environment(fingerprint: dict[str, Any]) -> dict[str, Any]:
    from kernelagent import __version__

    env = {k: fingerprint.get(k) for k in ENV_FIELDS}
    env["kernelagent"] = __version__
    return env


def settings_hash(config: dict[str, Any]) -> str:
    return _sha(config)


def env_hash(fingerprint: dict[str, Any]) -> str:
    return _sha(environment(fingerprint))


def evaluation_key(problem_sha256: str, candidate_sha256: str, config: dict[str, Any],
                   fingerprint: dict[str, Any]) -> str:
    """The content hash an evaluation is stored under."""
    return _sha({"problem": problem_sha256, "candidate": candidate_sha256,
                 "settings": settings_hash(config), "env": env_hash(fingerprint)})


def _loads(text: str | None) -> Any:
    return json.loads(text) if text else None


class NotOurStore(ValueError):
    """A SQLite database that belongs to something else, or a store that is damaged."""


def open_store(path: str | Path, option: str = "--store") -> "Store":
    """The store at `path`, or one line (UserError, exit 2) saying why it cannot be opened: a
    folder, a file that is not a SQLite database, another program's database, a damaged store,
    a database that is locked or unwritable."""
    from kernelagent.errors import UserError

    path = Path(path)
    if path.exists() and not path.is_file():
        raise UserError(f"{option} {path} is not a file")
    try:
        return Store(path)
    except NotOurStore as exc:
        raise UserError(f"{option} {path}: {exc}") from None
    except (sqlite3.Error, OSError) as exc:
        raise UserError(f"{option} {path}: cannot open it as a kernelagent store ({exc})") from None


def _check_ours(conn: sqlite3.Connection) -> None:
    """NotOurStore unless `conn` is empty or a kernelagent store, and whole (quick_check). Reads
    only: another program's database is left exactly as it was (not even its journal mode)."""
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    ours = app_id == APPLICATION_ID or (app_id == 0 and {"meta", "runs"} <= tables and conn.execute(
        "SELECT 1 FROM meta WHERE key = 'schema_version'").fetchone() is not None)
    if tables and not ours:
        shown = ", ".join(sorted(tables)[:4]) + (", ..." if len(tables) > 4 else "")
        raise NotOurStore(f"a SQLite database that is not a kernelagent store (its tables: {shown}); "
                          "give another --store path")
    if app_id not in (0, APPLICATION_ID):
        raise NotOurStore(f"a SQLite database of another program (application_id {app_id:#x}); "
                          "give another --store path")
    try:
        size = Path(conn.execute("PRAGMA database_list").fetchone()[2] or "").stat().st_size
    except OSError:
        size = 0
    if tables and size <= QUICK_CHECK_MAX_BYTES:
        problems = [r[0] for r in conn.execute("PRAGMA quick_check(3)").fetchall()]
        if problems != ["ok"]:
            raise NotOurStore(f"the store is damaged ({problems[0]}); move it aside to start a new one")


def damaged(exc: BaseException, path: str | Path) -> str:
    """One line for a store that fails where it is used (a damaged page past the open's check)."""
    from kernelagent.text import clean_text

    # the message may quote a damaged value: printable ASCII only (no U+FFFD runs), and short
    why = " ".join("".join(c for c in clean_text(exc) if " " <= c <= "~").split())
    why = why if len(why) <= 80 else why[:77] + "..."
    return f"the store {path} is damaged or unusable ({why}); move it aside to start a new one"


class Store:
    def __init__(self, path: str | Path, busy_timeout: float = 60.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(str(self.path), timeout=busy_timeout, isolation_level=None,
                                     check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        try:
            _check_ours(self._conn)
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            if "not a database" in str(exc):
                raise
            raise NotOurStore(f"the store is damaged ({exc}); move it aside to start a new one") from None
        except BaseException:
            self._conn.close()
            raise
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process kills
        self._conn.execute("PRAGMA foreign_keys=ON")
        with self._lock:
            self._conn.executescript(SCHEMA)
            if self._conn.execute("PRAGMA application_id").fetchone()[0] == 0:
                self._conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        with self.transaction() as db:
            db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                       (str(SCHEMA_VERSION),))

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: all of it is committed, or none of it."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    # -- runs --------------------------------------------------------------------------
    def open_run(self, run_id: str, mode: str, spec: dict[str, Any], out_dir: str) -> tuple[dict, bool]:
        """The run with this id, created if new, its folder now `out_dir` (checked by the caller:
        an --out given to a known run moves its later reports there). Returns (run, created)."""
        now = time.time()
        with self.transaction() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                db.execute("INSERT INTO runs (id, mode, status, spec, out_dir, created, updated) "
                           "VALUES (?, ?, 'running', ?, ?, ?, ?)",
                           (run_id, mode, json.dumps(spec, sort_keys=True), out_dir, now, now))
                created = True
            else:
                created = False
            db.execute("UPDATE runs SET status = 'running', updated = ?, sessions = sessions + 1, out_dir = ? "
                       "WHERE id = ?", (now, out_dir, run_id))
        return self.run(run_id), created

    def run(self, run_id: str) -> dict | None:
        rows = self._query("SELECT * FROM runs WHERE id = ?", (run_id,))
        if not rows:
            return None
        run = dict(rows[0])
        run["spec"] = _loads(run["spec"])
        run["fingerprint"] = _loads(run["fingerprint"])
        return run

    def runs(self) -> list[dict]:
        return [self.run(r["id"]) for r in self._query("SELECT id FROM runs ORDER BY created")]

    def update_run(self, run_id: str, *, status: str | None = None, fingerprint: dict | None = None,
                   add_wall_s: float = 0.0) -> None:
        with self.transaction() as db:
            if status is not None:
                db.execute("UPDATE runs SET status = ? WHERE id = ?", (status, run_id))
            if fingerprint is not None:
                db.execute("UPDATE runs SET fingerprint = ? WHERE id = ?", (json.dumps(fingerprint), run_id))
            db.execute("UPDATE runs SET wall_s = wall_s + ?, updated = ? WHERE id = ?",
                       (add_wall_s, time.time(), run_id))

    # -- problems ----------------------------------------------------------------------
    def add_problems(self, run_id: str, problems: list[dict]) -> None:
        """Register the run's problems (idempotent: known ones keep their state)."""
        with self.transaction() as db:
            for position, p in enumerate(problems):
                # A problem whose file changed is pending again; the others keep their state.
                db.execute("INSERT INTO problems (run_id, key, position, level, name, path, sha256) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, key) DO UPDATE SET "
                           "position = excluded.position, path = excluded.path, sha256 = excluded.sha256, "
                           "status = CASE WHEN problems.sha256 = excluded.sha256 THEN problems.status "
                           "ELSE 'pending' END",
                           (run_id, p["key"], position, p.get("level"), p["name"], p["path"], p["sha256"]))

    def problems(self, run_id: str) -> list[dict]:
        out = []
        for row in self._query("SELECT * FROM problems WHERE run_id = ? ORDER BY position", (run_id,)):
            item = dict(row)
            item["record"] = _loads(item["record"])
            out.append(item)
        return out

    def start_problem(self, run_id: str, key: str, clear_attempts: bool = False) -> None:
        with self.transaction() as db:
            if clear_attempts:
                db.execute("DELETE FROM attempts WHERE run_id = ? AND problem_key = ?", (run_id, key))
            db.execute("UPDATE problems SET started = ?, status = 'pending' WHERE run_id = ? AND key = ?",
                       (time.time(), run_id, key))

    def finish_problem(self, run_id: str, key: str, status: str, record: dict) -> None:
        with self.transaction() as db:
            db.execute("UPDATE problems SET status = ?, record = ?, finished = ? WHERE run_id = ? AND key = ?",
                       (status, json.dumps(record, default=str), time.time(), run_id, key))

    # -- evaluations and attempts -----------------------------------------------------
    def lookup(self, keys: list[str]) -> tuple[str, dict] | None:
        """The first stored evaluation among `keys`: (key, EvalResult dict), or None."""
        for key in keys:
            rows = self._query("SELECT result FROM evaluations WHERE key = ?", (key,))
            if rows:
                return key, json.loads(rows[0]["result"])
        return None

    def record_evaluation(self, key: str, result: dict, *, settings: dict, fingerprint: dict,
                          run_id: str | None, cacheable: bool = True,
                          attempt: dict | None = None) -> None:
        """One performed evaluation: its log row, its cached result (when cacheable) and,
        when given, the attempt that used it; all in one transaction."""
        now = time.time()
        seconds = (result.get("stage_seconds") or {}).get("total")
        with self.transaction() as db:
            db.execute("INSERT INTO evaluation_log (key, run_id, device, seconds, created) VALUES (?, ?, ?, ?, ?)",
                       (key, run_id, result.get("device"), seconds, now))
            if cacheable:
                passed = int(result_passed(result))
                db.execute("INSERT OR IGNORE INTO evaluations (key, problem_sha256, candidate_sha256, "
                           "settings_sha256, env_sha256, status, passed, result, seconds, device, run_id, created) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (key, result.get("problem_sha256", ""), result.get("candidate_sha256", ""),
                            settings_hash(settings), env_hash(fingerprint), result.get("status", ""), passed,
                            json.dumps(result, default=str), seconds, result.get("device"), run_id, now))
            if attempt is not None:
                self._insert_attempt(db, attempt, now)

    def record_attempt(self, attempt: dict) -> None:
        with self.transaction() as db:
            self._insert_attempt(db, attempt, time.time())

    @staticmethod
    def _insert_attempt(db: sqlite3.Connection, a: dict, now: float) -> None:
        db.execute("INSERT OR REPLACE INTO attempts (run_id, problem_key, sample, candidate_sha256, eval_key, "
                   "reused, summary, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   (a["run_id"], a["problem_key"], a["sample"], a["candidate_sha256"], a.get("eval_key"),
                    int(bool(a.get("reused"))), json.dumps(a.get("summary") or {}, default=str), now))

    def attempts(self, run_id: str, problem_key: str | None = None) -> list[dict]:
        sql, args = "SELECT * FROM attempts WHERE run_id = ?", (run_id,)
        if problem_key is not None:
            sql, args = sql + " AND problem_key = ?", (run_id, problem_key)
        rows = self._query(sql + " ORDER BY id", args)
        return [{**dict(r), "summary": _loads(r["summary"])} for r in rows]

    def evaluations_performed(self, run_id: str | None = None) -> int:
        if run_id is None:
            return self._query("SELECT COUNT(*) AS n FROM evaluation_log")[0]["n"]
        return self._query("SELECT COUNT(*) AS n FROM evaluation_log WHERE run_id = ?", (run_id,))[0]["n"]

    def evaluation_log(self, run_id: str | None = None) -> list[dict]:
        if run_id is None:
            return [dict(r) for r in self._query("SELECT * FROM evaluation_log ORDER BY id")]
        return [dict(r) for r in self._query("SELECT * FROM evaluation_log WHERE run_id = ? ORDER BY id",
                                             (run_id,))]


def result_passed(result: dict) -> bool:
    """EvalResult.passed, on the dict form: correct and nothing flagged for review or rejection."""
    return result.get("status") == "correct" and not any(
        f.get("severity") in ("review", "reject") for f in result.get("flags") or [])
