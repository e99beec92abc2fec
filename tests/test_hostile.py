"""Hostile candidates (issue 11): the candidate's author knows our source and attacks the
harness itself, not only the comparison. One table, run through `kernelagent eval --json` as a
subprocess, in every isolation mode.

Every row gets the same checks:
  (a) secrets: canaries in the caller's environment (OPENAI_API_KEY, KA_CANARY_TOKEN), in a
      fake ~/.netrc and in the caller's command line appear nowhere in stdout, stderr, the JSON
      result or any ka-evil file; the cache tree (baseline cache, CUDA build cache, bench
      store) is byte-for-byte unchanged;
  (b) nothing the attack started or wrote survives: no 'ka-evil-daemon' process a second
      after the eval returned, no new ka-evil-* file under /tmp, /dev/shm or HOME;
  (c) the caller survives (exit code 0 or 1, stdout is one JSON object, no traceback) and an
      honest kernel evaluated next, with the same home and caches, is correct with a sane
      speedup;
and its own verdict: a status (or tuple of statuses), an optional flag kind, an optional extra
check. Every hostile candidate is also wrong or cheating (x*2+1, torch doing the work, a fake
time), so an attack that works shows up as a wrong verdict or a failed check.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import CANDIDATES, REPO
from tests.hostile_scene import (aftermath, base_env, clean_up, evil_files, evil_processes, file_canaries,
                                 make_scene, remove, tree_hash)
from tests.xdist_locks import held

ADV = Path(__file__).resolve().parent / "adversarial"
RELU = CANDIDATES / "relu_problem.py"
SOFTMAX = Path(__file__).parent / "adversarial" / "softmax_problem.py"
HONEST = CANDIDATES / "relu_good.py"
EVAL_OPTIONS = ["--json", "--trials", "2", "--device", "cpu"]
EVAL_TIMEOUT = 300

CORRECT, INCORRECT, REJECTED = "correct", "incorrect", "rejected"
TIMEOUT, CRASHED = "timeout", "crashed"

# --------------------------------------------------------------------------------------
# What each isolation mode guarantees (the rebuilt harness: kernelagent/harness/{caller,server,
# child}/, protocol.py). A row names the guarantees its expectations rest on; where the mode
# lacks one, the row's failures are reported as xfail (with what got through) instead of
# failures, because that mode cannot promise them.
#
#   channel  the candidate's process holds only its own pipe to the server (every other fd is
#            closed right after the fork); every message is schema-checked JSON with the job id,
#            the caller<->server socket carries a per-job nonce sent only after the fork; no
#            pickle anywhere; anything unexpected is `rejected: protocol`, never a crash.
#            Lives outside the candidate's process.
#   verdict  `correct` only when every planned check was compared in the reference process; a
#            message from the candidate's process is a claim (a `done` before the plan is a
#            protocol breach).
#   clock    the timed loop is ordered and clocked by the server, against a calibration loop
#            run by the reference process; in-process times that disagree are reported as
#            `clock-mismatch` (review) or `tampering` (reject), and the server's time is used.
#   inputs   seeds drawn with os.urandom in the server after the fork (unless --seed), each
#            revealed only when its check runs; a secret subset of the timed calls' outputs (plus
#            the last) is compared by the reference.
#   pid      a pid namespace per job: no other process visible, the job's pid 1 dying kills
#            every process it started (daemons included).
#   mount    read-only root, only the job's scratch writable, the caches (KERNELAGENT_CACHE_DIR),
#            HOME and other jobs' scratch hidden, private /proc and /dev/shm.
#   secrets  a user namespace with zero capabilities (also when the caller is root), nothing of
#            the caller's environment or home reachable.
#   files    (issue 24, class 4) a minimal read-only view (the system's directories, the
#            interpreter and its packages; the caller's working directory, home, /tmp and every
#            other top-level directory hidden) and, when the caller is root, an unprivileged uid,
#            so files only root may read are out of reach where the view shows them. Not held
#            under bubblewrap as root (its layer keeps the job at uid 0 outside; the result says so).
#   inproc   in-process evidence (monitor, audit hook, dispatch recorder) that the candidate
#            cannot switch off. No mode guarantees it: anything in the candidate's process is
#            the candidate's (issue 11: "no guarantee may rest on them"). On the CPU there is
#            no out-of-process evidence of *who* computed a result (torch or the kernel), so
#            rows that need it are xfail everywhere here; on a GPU a server-owned profiler
#            session can replace it.
#
# Without a pid namespace (`--isolation none`) the candidate's process runs as the caller's uid
# next to the server, so the out-of-process guarantees hold only against attacks on the
# harness's channels and messages, not against a candidate that reaches into the server or
# the caller through /proc or ptrace (h6 rows show the caller's environment is readable there).
# --------------------------------------------------------------------------------------
OUT_OF_PROCESS = frozenset({"channel", "verdict", "clock", "inputs"})
NAMESPACED = OUT_OF_PROCESS | {"pid", "mount", "secrets", "files"}
GUARANTEES: dict[str, frozenset[str]] = {
    # "auto" = bubblewrap around the server where it works + per-job namespaces where they
    # work; the test reads the result's `isolation` field and judges by what auto resolved to.
    "auto": NAMESPACED,
    "namespaces": NAMESPACED,
    "bwrap": NAMESPACED,
    # Only fd closing and a process group: what lives outside the candidate's process.
    "none": OUT_OF_PROCESS,
}
# "default" runs `kernelagent eval` without --isolation; it must behave as "auto".
GUARANTEES["default"] = GUARANTEES["auto"]
# `default` repeats `auto`; it runs on these rows only (one per sandbox guarantee), to keep the
# table's run time down.
DEFAULT_ROWS = {"h1_socket_pickle.py", "h4_baseline_cache.py", "h5_setsid_daemon.py", "h6_ancestor_environ.py"}


def _resolved_guarantees(mode: str, result: dict) -> frozenset[str]:
    """What the mode guarantees as it resolved on this machine: auto (and default) without
    working namespaces fall back to no sandbox, and every result says so."""
    if mode not in ("auto", "default"):
        return GUARANTEES[mode]
    iso = result.get("isolation") or {}
    text = json.dumps(iso)
    if iso and '"namespaces"' not in text and '"bwrap"' not in text:
        return GUARANTEES["none"]
    return GUARANTEES[mode]


def _held(mode: str, result: dict) -> frozenset[str]:
    """_resolved_guarantees, less `files` where the job kept uid 0 outside (bubblewrap as root)."""
    held = _resolved_guarantees(mode, result)
    if "uid 0 outside" in json.dumps(result.get("isolation") or {}):
        held = held - {"files"}
    return held


def _offered_modes() -> set[str]:
    """The isolation modes `kernelagent eval --help` lists (a module-level check, so the file
    is collected whatever the CLI offers)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="400", NO_COLOR="1", TERM="dumb")
    try:
        out = subprocess.run(_cli() + ["eval", "--help"], capture_output=True, text=True, timeout=120, env=env).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    match = re.search(r"--isolation(.*?)(\n\s*[│|]?\s*--|\Z)", out, re.S)
    if not match:
        return set()
    text = re.sub(r"\s+", " ", match.group(1))
    return {mode for mode in GUARANTEES if mode != "default" and re.search(rf"\b{mode}\b", text)}


def _cli() -> list[str]:
    exe = shutil.which("kernelagent", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    return [exe] if exe else [sys.executable, "-m", "kernelagent"]


OFFERED = _offered_modes()


def _namespaces_work() -> bool:
    """Whether per-job namespaces work on this machine (auto and default resolve to them there)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        out = subprocess.run([sys.executable, "-m", "kernelagent.harness.jail.probe"], capture_output=True,
                             text=True, timeout=120, env=env).stdout
        return json.loads(out).get("namespaces_work") is True
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return False


# Run in several processes (pytest-xdist), rows must not see each other's leftovers. A row whose
# mode contains nothing here (none; auto and default where namespaces do not work) leaves files in
# /tmp and /dev/shm and processes on the host until the test removes them, which another row's
# before/after comparison would count as its own: such a row holds the "hostile" lock alone (the
# others share it), and they form one xdist group (one worker, one after another) so that they
# seldom wait. A row whose leftovers act on other evaluations as well (h5's daemon rewrites every
# job's candidate.py under /tmp) runs alone in the whole session (`alone`, tests/xdist_locks.py).
UNCONTAINED = {"none"} if _namespaces_work() else {"none", "auto", "default"}
ACTS_ON_OTHERS = {"h5_setsid_daemon.py"}


def _mode_marks(mode: str) -> list:
    if mode == "default" or mode in OFFERED:
        return []
    return [pytest.mark.xfail(strict=False, reason="needs --isolation " + mode)]


def _apart_marks(row: "Row", mode: str) -> list:
    if mode not in UNCONTAINED:
        return []
    return [pytest.mark.xdist_group("hostile-uncontained")] + ([pytest.mark.alone] if row.candidate in ACTS_ON_OTHERS
                                                               else [])


# --------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    candidate: str
    expected: tuple[str, ...]
    needs: frozenset[str]
    flag: str | None = None
    # An extra check on (hostile result, honest result): returns a problem, or None.
    check: Callable[[dict, dict], str | None] | None = None
    problem: Path = RELU
    options: tuple[str, ...] = ()  # more `eval` options for this row


def honest_time(hostile: dict, honest: dict) -> str | None:
    """A candidate judged correct must be timed near the truth: its kernel is relu_good.py's,
    so its median may not be far below the honest one measured right after it (a loose
    factor: the CPU is shared and noisy; the issue's bar is 10% on a GPU)."""
    loop = hostile.get("timed_loop") or {}
    claimed, server = loop.get("claimed_mean_ms"), loop.get("server_ms_per_call")
    if claimed is not None and server and claimed < 0.5 * server and len(loop.get("calibrations_s") or []) != 2:
        return "a claim far below the server's clock did not get the loop calibrated a second time"
    if hostile.get("status") != CORRECT:
        return None
    mine = (hostile.get("timings") or {}).get("candidate", {}).get("median_ms")
    truth = (honest.get("timings") or {}).get("candidate", {}).get("median_ms")
    if mine is None or truth is None:
        return None
    if mine < 0.4 * truth:
        return f"timed at {mine:.4g} ms, the same kernel honestly takes {truth:.4g} ms"
    return None


def server_clocked_the_work(hostile: dict, honest: dict) -> str | None:
    """Whatever the verdict, the server's own clock must have seen the work the candidate did
    after its report (its kernel is relu_good.py's): its time per call near the honest one."""
    server = (hostile.get("timed_loop") or {}).get("server_ms_per_call")
    truth = (honest.get("timings") or {}).get("candidate", {}).get("median_ms")
    if hostile.get("status") in (CORRECT, REJECTED) and server is not None and truth and server < 0.4 * truth:
        return f"the server clocked {server:.4g} ms per call; the same kernel honestly takes {truth:.4g} ms"
    return honest_time(hostile, honest)


def need(*names: str) -> frozenset[str]:
    return frozenset(names)


TABLE = [
    # 1 code execution in the caller / garbage on its socket: the candidate must not hold it.
    # Its inherited fd is closed in every mode, but it also takes the server's fd with
    # pidfd_getfd (its parent, same uid): only a pid namespace hides the parent. In `none` the
    # frame reaches the caller, which survives it (no pickle, no nonce) but ends the job as a
    # harness error and restarts the server (checked by the survival asserts in every mode).
    Row("h1_socket_pickle.py", (INCORRECT, REJECTED), need("channel", "pid")),
    Row("h1_socket_garbage.py", (INCORRECT, REJECTED), need("channel", "pid")),
    # issue 24, class 3: half a frame on its own channel, then silence (the stage's timeout, at
    # its limit: short here) or death (its crash, never a harness error). The server reads
    # every frame of the candidate's against the stage's deadline (protocol.read_frame).
    Row("r3_partial_frame.py", (TIMEOUT,), need("channel"), options=("--stage-timeout", "correctness=8")),
    Row("r3_partial_frame_exit.py", (CRASHED,), need("channel")),
    # ...and dying the moment its (wrong) outputs are handed over, before the server's reply:
    # the compared outputs' verdict, or its crash; the server's send to a closed channel was a
    # harness error.
    Row("r3_exit_after_outputs.py", (INCORRECT, CRASHED), need("channel")),
    # 2 forged events on the candidate's own channel: claims, never conclusions.
    Row("h2_forged_done.py", (INCORRECT, REJECTED), need("verdict")),
    Row("h2_forged_timing.py", (CORRECT, REJECTED), need("clock"), check=honest_time),
    # issue 24, class 1 on the CPU: every op that is not glue is work, inside launches too
    Row("r1_index_softmax.py", (REJECTED,), need("inproc"), flag="no-custom-kernel", problem=SOFTMAX),
    Row("r1_relu_in_jit.py", (REJECTED,), need("inproc"), flag="no-custom-kernel"),
    # issue 24, class 2: samples redistributed with their sum kept, and outputs computed after
    # the report that stopped the clock. The server's per-segment clock defines the time.
    Row("r2_bimodal_samples.py", (CORRECT, REJECTED), need("clock"), check=honest_time),
    Row("r2_outputs_after_report.py", (CORRECT, REJECTED), need("clock"), check=server_clocked_the_work),
    # ...and a report with no samples at all: the loop did not run as ordered.
    Row("r2_empty_samples.py", (REJECTED,), need("clock"), flag="protocol"),
    # issue 41, class 3: every number validated, every message type bounded in count: samples
    # below zero (a harness error, or `correct` with a review flag), samples of 1e308 (believed),
    # a flood of 300,000 progress messages before each check's outputs (50 CPU-seconds, correct).
    Row("r4_negative_samples.py", (REJECTED,), need("clock"), flag="protocol"),
    Row("r4_huge_samples.py", (REJECTED,), need("clock"), flag="protocol"),
    Row("r4_stage_flood.py", (REJECTED,), need("channel"), flag="protocol"),
    # issue 54, class 5: laundering a verdict into a harness error through what the server cannot
    # parse: a 200,000-deep array (RecursionError), integers of 10**400 in a profiler row and in
    # the timing samples (OverflowError; one after a failed check, one hiding a cache); and a
    # forged "harness out of memory". Bounded JSON refuses the first three (`rejected: protocol`),
    # the check failed first stays the verdict, and the claim is the candidate's own failure.
    Row("r5_deep_json.py", (REJECTED,), need("channel"), flag="protocol"),
    Row("r5_huge_int_kernels.py", (REJECTED,), need("channel"), flag="protocol"),
    Row("r5_huge_int_after_failure.py", (INCORRECT,), need("channel", "verdict")),
    Row("r5_huge_int_sample.py", (REJECTED,), need("clock"), flag="protocol"),
    Row("r5_forged_harness_oom.py", ("runtime_error",), need("verdict")),
    # 3 in-process defences switched off. Where the payload is hidden work (torch or a helper
    # process doing the ReLU), only in-process evidence can tell on the CPU.
    Row("h3_exec_string.py", (REJECTED, INCORRECT), need("inproc")),
    Row("h3_gc_monitor_none.py", (REJECTED,), need("inproc")),
    Row("h3_audit_closure.py", (REJECTED, INCORRECT), need("inproc")),
    Row("h3_audit_hooks_cleared.py", (REJECTED, INCORRECT), need("inproc")),
    Row("h3_dispatch_mode_pop.py", (REJECTED,), need("inproc")),
    Row("h3_timer_clock.py", (CORRECT, REJECTED), need("clock"), check=honest_time),
    Row("h3_transfer_shadow.py", (REJECTED,), need("inproc")),
    Row("h3_fork_exec.py", (REJECTED, INCORRECT), need("inproc")),
    # 4 writes outside scratch, caches and store: the kernel is x*2+1, so the verdict is
    # incorrect; what must not happen is a changed cache tree or a file left behind.
    Row("h4_dir_fd_write.py", (INCORRECT,), need("mount")),
    Row("h4_proc_self_root.py", (INCORRECT,), need("mount")),
    Row("h4_dev_shm.py", (INCORRECT,), need("mount")),
    Row("h4_sqlite_store.py", (INCORRECT,), need("mount")),
    Row("h4_baseline_cache.py", (INCORRECT,), need("mount")),
    Row("h4_cuda_cache_plant.py", (INCORRECT,), need("mount")),
    # 5 persistence: the daemon must die with the job.
    Row("h5_setsid_daemon.py", (INCORRECT,), need("pid")),
    # 6 secrets: nothing of the caller reachable; the candidate raises with what it found, so
    # a leak is also a wrong verdict (runtime error instead of incorrect).
    Row("h6_ancestor_environ.py", (INCORRECT,), need("pid", "secrets")),
    Row("h6_cmdline.py", (INCORRECT,), need("pid", "secrets")),
    Row("h6_netrc_proc_root.py", (INCORRECT,), need("pid", "mount", "secrets")),
    # Its ctypes calls may be flagged (tampering) as well as its kernel being wrong.
    Row("h6_remount_rw.py", (INCORRECT, REJECTED), need("mount", "secrets")),
    # issue 24, class 4: the caller's project .env, a top-level directory of the host, a
    # root-only file in a directory the view shows (canaries placed by file_canaries).
    Row("r4_file_secrets.py", (INCORRECT,), need("files")),
    # 7 predictable inputs.
    Row("h7_precomputed_seeds.py", (INCORRECT,), need("inputs")),
    # Its timed calls are right, only computed by torch: telling them from checks uses the
    # process's own state (the dispatch stack), which no in-process change can hide for good (the
    # call stack differs too). The outputs are verified (a secret subset); who computed them only
    # out-of-process kernel evidence can say, which is not built yet (issue 11, open).
    Row("h7_timed_vs_checked.py", (CORRECT, REJECTED), need("inproc"), check=honest_time),
]


# --------------------------------------------------------------------------------------
# The environment of one attack
# --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def template_home(tmp_path_factory) -> Path:
    """A home with a fake .netrc and a populated cache (baseline entry from one honest
    evaluation, an empty CUDA build cache, a bench store), copied for each row."""
    home = tmp_path_factory.mktemp("hostile-template") / "home"
    cache = home / ".cache" / "kernelagent"
    cache.mkdir(parents=True)
    (home / ".netrc").write_text("machine api.example.com login ka password netrc-canary-template\n")
    with sqlite3.connect(cache / "bench.sqlite") as db:
        db.execute("CREATE TABLE attempts (candidate TEXT, status TEXT, speedup REAL)")
        db.execute("INSERT INTO attempts VALUES ('relu_good', 'correct', 0.5)")
    env = base_env(home, {})
    proc = subprocess.run(_cli() + ["eval", str(RELU), str(HONEST)] + EVAL_OPTIONS, capture_output=True,
                          text=True, env=env, timeout=EVAL_TIMEOUT, cwd=str(home))
    result = json.loads(proc.stdout)
    assert result["status"] == CORRECT, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert list((cache / "baselines").glob("*.json")), "the honest evaluation cached no baseline"
    return home


def _expected_rc(result: dict) -> int:
    """The exit code `kernelagent eval` gives a verdict: 0 only for a correct one that nothing holds."""
    return 0 if result.get("status") == CORRECT and not any(
        f.get("severity") in ("review", "reject") for f in result.get("flags", [])) else 1


def _honest_rc(honest: dict) -> int:
    """The exit code the honest verdict alone would give (1 where there is none)."""
    return 0 if honest and _expected_rc(honest) == 0 else 1


def _run_eval(candidates: list[Path], mode: str, env: dict[str, str], cwd: Path,
              options: tuple[str, ...] = (), problem: Path = RELU, timeout: float = EVAL_TIMEOUT) -> tuple[int, str, str]:
    """`kernelagent eval PROBLEM CANDIDATE...`: one JSON line per candidate on stdout."""
    cmd = _cli() + ["eval", str(problem)] + [str(c) for c in candidates] + EVAL_OPTIONS + list(options)
    if mode != "default":
        cmd += ["--isolation", mode]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=str(cwd))
    return proc.returncode, proc.stdout, proc.stderr


def _params() -> list:
    params = []
    for mode in ("default", "auto", "namespaces", "bwrap", "none"):
        for row in TABLE:
            if mode == "default" and row.candidate not in DEFAULT_ROWS:
                continue
            params.append(pytest.param(row, mode, id=f"{row.candidate.removesuffix('.py')}-{mode}",
                                       marks=_mode_marks(mode) + _apart_marks(row, mode) + _batch_marks(row, mode)))
    return params


@pytest.fixture(autouse=True)
def rows_apart(request):
    """Under pytest-xdist: an uncontained row runs while no other row does (UNCONTAINED)."""
    with held(request.config, "hostile", exclusive=request.node.callspec.params["mode"] in UNCONTAINED):
        yield


# --------------------------------------------------------------------------------------
# A contained mode's rows, judged by one harness (CI's time)
# --------------------------------------------------------------------------------------
# Every row of a contained mode (its jail keeps files and processes in) on the ReLU problem with
# no options of its own runs in ONE `kernelagent eval` command with the others of its mode, one
# after another on one harness, the honest kernel last: one harness start for ~35 rows instead
# of one each (the table was a third of CI's worker-seconds). Each row is still its own test,
# judged on its own verdict and its own JSON line (a canary in it is its leak); what the command
# as a whole shows (its exit code and stderr, processes or files left, the cache tree, the honest
# evaluation at the end) is judged for every row of the batch, since any of them could be its
# cause. Each later candidate also shows that the harness that served the attacks before it
# still judges correctly.
BATCH_TIMEOUT = 1500


def _batched(row: Row, mode: str) -> bool:
    return mode not in UNCONTAINED and row.problem == RELU and not row.options


def _batch_marks(row: Row, mode: str) -> list:
    if not _batched(row, mode):
        return []
    return [pytest.mark.xdist_group(f"hostile-batch-{mode}"), pytest.mark.timeout(BATCH_TIMEOUT + 120)]


@dataclass
class Batch:
    results: dict[str, dict] = field(default_factory=dict)
    row_problems: dict[str, list[str]] = field(default_factory=dict)
    honest: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # the command's, counted against every row
    survival: list[str] = field(default_factory=list)


_BATCHES: dict[str, Batch] = {}


def _batch(mode: str, template_home: Path, tmp_path_factory) -> Batch:
    """The batch of `mode`, run by its first row in this process: its rows share one xdist
    group, so one worker runs them all (tests/conftest.py keeps groups working under pytest 9.2,
    and tests/test_xdist_groups.py checks it)."""
    if mode not in _BATCHES:
        _BATCHES[mode] = _compute_batch(mode, template_home, tmp_path_factory)
    return _BATCHES[mode]


def _compute_batch(mode: str, template_home: Path, tmp_path_factory) -> Batch:
    batch = Batch()
    try:
        _run_batch(mode, template_home, tmp_path_factory.mktemp(f"hostile-batch-{mode}"), batch)
    except Exception as exc:  # noqa: BLE001 - said in every row of the batch
        batch.survival.append(f"the batch's command failed: {type(exc).__name__}: {str(exc)[:600]}")
    return batch


def _run_batch(mode: str, template_home: Path, root: Path, batch: Batch) -> None:
    rows = [r for r in TABLE if _batched(r, mode) and (mode != "default" or r.candidate in DEFAULT_ROWS)]
    scene = make_scene(template_home, root)
    home, workdir, env, cache = scene.home, scene.workdir, scene.env, scene.cache
    for row in rows:
        shutil.copyfile(ADV / row.candidate, workdir / row.candidate)
    planted = file_canaries(workdir, scene.token)
    secrets_to_hide = scene.secrets + list(planted)
    cache_before = tree_hash(cache)
    evil_before = evil_files(home)
    try:
        rc, out, err = _run_eval([workdir / r.candidate for r in rows] + [HONEST], mode, env, workdir,
                                 timeout=BATCH_TIMEOUT)
    finally:
        for path in planted.values():
            remove(path)

    if rc not in (0, 1):
        batch.survival.append(f"exit code {rc}")
    if "Traceback (most recent call last)" in err:
        batch.survival.append("traceback on stderr: " + err[-800:])
    lines = out.splitlines()
    if len(lines) != len(rows) + 1:
        batch.survival.append(f"{len(lines)} lines on stdout for {len(rows) + 1} candidates: {out[-300:]!r}")
    for row, line in zip(rows + [None], lines):
        try:
            result = json.loads(line)
        except ValueError:
            batch.survival.append(f"a stdout line is not one JSON object: {line[-300:]!r}")
            continue
        leaked = [x for x in secrets_to_hide if x in line]
        if row is None:
            batch.honest = result
            if leaked:
                batch.problems.append(f"canary in the honest evaluation's line: {leaked}")
            continue
        batch.results[row.candidate] = result
        if leaked:
            batch.row_problems.setdefault(row.candidate, []).append(f"canary in stdout: {leaked}")

    found, daemons, new_files = aftermath(home, evil_before, secrets_to_hide, err, cache, cache_before)
    batch.problems += found
    judged = list(batch.results.values()) + ([batch.honest] if batch.honest else [])
    expected_rc = max([_expected_rc(r) for r in judged] or [0])
    if judged and rc in (0, 1) and rc != expected_rc:
        batch.survival.append(f"exit code {rc} does not match the verdicts")
    batch.problems += _honest_problems(batch.honest, _honest_rc(batch.honest), err)
    clean_up(daemons, new_files)


def _honest_problems(honest: dict, hrc: int, herr: str) -> list[str]:
    problems = []
    if honest.get("status") != CORRECT or hrc != 0:
        problems.append(f"the honest evaluation after it: exit {hrc}, status {honest.get('status')!r}: "
                        f"{str(honest.get('reason'))[:300]} {herr[-300:]}")
    for name, speedup in (honest.get("speedups") or {}).items():
        if speedup > 10:  # the interpreter on the CPU is far slower than eager; 10x is absurd
            problems.append(f"the honest evaluation after it reports a {speedup:.0f}x speedup over {name}")
    return problems


def _verdict_problems(row: Row, result: dict, honest: dict) -> list[str]:
    """The row's own verdict: its status, its flag, its extra check."""
    problems = []
    status = result.get("status")
    if result and status not in row.expected:
        problems.append(f"status {status!r}, expected {' or '.join(row.expected)}: {str(result.get('reason'))[:300]}")
    if result and row.flag and not any(f.get("kind") == row.flag for f in result.get("flags", [])):
        problems.append(f"no {row.flag!r} flag: {[f.get('kind') for f in result.get('flags', [])]}")
    if row.check is not None and result:
        extra = row.check(result, honest)
        if extra:
            problems.append(extra)
    return problems


def _conclude(row: Row, mode: str, result: dict, survival: list[str], problems: list[str], honest: dict) -> None:
    # The caller's survival is a guarantee of every mode (it lives outside the candidate).
    assert not survival, f"{row.candidate} [{mode}]: " + "; ".join(survival)
    # A jail that could not be made is the harness's fault in every mode, never an xfail.
    for verdict in (result, honest):
        assert not str(verdict.get("reason", "")).startswith("the candidate's sandbox could not be set up"), \
            f"{row.candidate} [{mode}]: {verdict.get('reason')}"
    missing = row.needs - _held(mode, result)
    if problems and missing:
        pytest.xfail(f"mode {mode!r} cannot guarantee {sorted(missing)}; got through: " + "; ".join(problems))
    assert not problems, f"{row.candidate} [{mode}] got through: " + "; ".join(problems)


@pytest.mark.parametrize("row, mode", _params())
def test_hostile(row: Row, mode: str, template_home: Path, tmp_path: Path, tmp_path_factory, request) -> None:
    if _batched(row, mode):
        batch = _batch(mode, template_home, tmp_path_factory)
        result = batch.results.get(row.candidate, {})
        survival = list(batch.survival) + ([] if result or batch.survival else ["no verdict for this candidate"])
        problems = batch.row_problems.get(row.candidate, []) + batch.problems
        if not batch.honest and not batch.survival:
            survival.append("no verdict for the honest candidate after the batch")
        _conclude(row, mode, result, survival, _verdict_problems(row, result, batch.honest) + problems, batch.honest)
        return
    scene = make_scene(template_home, tmp_path)
    home, workdir, env, cache = scene.home, scene.workdir, scene.env, scene.cache
    candidate = workdir / row.candidate
    shutil.copyfile(ADV / row.candidate, candidate)
    planted = file_canaries(workdir, scene.token)
    request.addfinalizer(lambda: [remove(p) for p in planted.values()])
    secrets_to_hide = scene.secrets + list(planted)
    cache_before = tree_hash(cache)
    evil_before = evil_files(home)

    problems: list[str] = []
    # The honest evaluation after the attack runs in the same command, on the same harness: one
    # start paid, not two (CI's time), and the harness that served the attack must serve the next
    # candidate as well. What the attack left (processes, files) is found after both; a mode that
    # guarantees nothing survives must leave nothing, and an uncontained one fails the row anyway
    # (xfail where the mode cannot promise it). A row on another problem or with options of its
    # own runs its honest evaluation in a command of its own.
    together = row.problem == RELU and not row.options
    if together:
        rc, out, err = _run_eval([candidate, HONEST], mode, env, workdir)
        out, _, hout = out.partition("\n")
        herr = err
    else:
        rc, out, err = _run_eval([candidate], mode, env, workdir, row.options, row.problem)
        time.sleep(1.0)  # what a daemon does a moment later counts too

    # (c) the caller survived this one.
    survival: list[str] = []
    if rc not in (0, 1):
        survival.append(f"exit code {rc}")
    if "Traceback (most recent call last)" in err:
        survival.append("traceback on stderr: " + err[-800:])
    try:
        result = json.loads(out)
    except ValueError:
        result = {}
        survival.append(f"stdout is not one JSON object: {out[-300:]!r}")

    # (a) and (b): nothing survives, no secret and no cache touched.
    found, daemons, new_files = aftermath(home, evil_before, secrets_to_hide, err, cache, cache_before)
    problems += found
    leaked = [x for x in secrets_to_hide if x in out + (hout if together else "")]
    if leaked:
        problems.append(f"canary in stdout: {leaked}")

    expected_rc = _expected_rc(result)

    # Clean up what the attack left: before the honest run where that runs in a command of its
    # own (it must not inherit them), after both where they ran together.
    clean_up(daemons, new_files)

    # (c) the next evaluation, honest, with the same home and caches, still works.
    if not together:
        hrc, hout, herr = _run_eval([HONEST], mode, env, workdir)
    try:
        honest = json.loads(hout)
    except ValueError:
        honest = {}
    if together:  # one exit code for both verdicts
        hrc = _honest_rc(honest)
        expected_rc = max(expected_rc, hrc)
    if result and rc in (0, 1) and rc != expected_rc:
        survival.append(f"exit code {rc} does not match the verdict {result.get('status')!r}")
    problems += _honest_problems(honest, hrc, herr) + _verdict_problems(row, result, honest)
    clean_up(evil_processes(), evil_files(home) - evil_before)  # a daemon may have outlived even the honest run

    _conclude(row, mode, result, survival, problems, honest)
