"""Throughput of `kernelagent bench --candidates` on 1 GPU, then on 2 (or 4) GPUs.

Evaluates the Triton solutions under benchmarks/solutions/ against their problems as one
batch, with the full default harness settings (5 trials, timing, eager and torch.compile
baselines), first on GPU 0 alone and then on GPUs 0 and 1 (or the sets given). Every measurement
gets a fresh store and a fresh baseline cache, so nothing is skipped or answered from a cache
(--baselines shared seeds each cache with baselines timed once, below). With
--samples N, each solution is evaluated N times as N distinct candidates (a comment line
makes their content differ), to give the GPUs more work than the problem count.

    python benchmarks/bench_throughput.py --out throughput.json [--samples 2] [--gpu-sets 0 0,1 [0,1,2,3]]
        [--filter 'level1/*'] [--baselines fresh|shared] [--compare]

Prints, per GPU set: evaluations, wall seconds (harness start included), evaluations per
GPU-minute, how many were correct; then each 1 -> N GPU speedup and scaling efficiency
(speedup / N). Sets naming a GPU the machine lacks are left out.

Each row also carries a host-time profile: the seconds every stage took, summed over the
evaluations (starting the harness servers, the caller's wait for another GPU's baselines, the
server's load, compile, correctness, timing and baselines, the round trip), the store's share,
how many evaluations timed baselines, the CPU seconds the harness processes used (user +
system, counted by each server for its jobs: overlapping jobs count each other's), and each GPU's
idle time (wall minus its evaluations). `host_cpu` is the host's CPU while the batch ran, by
process kind (benchmarks/host_cpu.py: the servers, the references, the candidates, Inductor's
compile workers, ncu, the toolchain), and per evaluation: the machine's, and what was sampled
below this process.

--overlap measures one device instead: the same candidates evaluated one at a time, then several
at once, plus one candidate beside hostile spinners (benchmarks/overlap.py):

    python benchmarks/bench_throughput.py --overlap --filter 'level1/*' --samples 2 --out overlap.json

--baselines shared times each problem's baselines once, in an uncounted warm-up, and starts every
row's fresh cache with those entries (nothing else of the cache): every row then compares the
candidates with the same baselines, so a problem about as fast as Inductor is a win (and audited)
in every row or in none, and no row's fill waits for Inductor (issue 59's first result "with warm
caches"). The default, fresh, times them in every row as before.

Every row on N > 1 devices is compared with the one-device row (`scaling_1_to_N`: the batch's
wall, the pace after the fill, the steady state, the first results and the audits of both).
Rows that do not fit one call are measured in consecutive calls with one --baselines-dir, then
compared with `--join ONE.json MANY.json --out joined.json`.

--compare measures every GPU set twice in one call: first with the host tuning off (as bench
ran before issue 17: every server on every CPU, each evaluation compiling its baselines in a
fresh cache, samples queued problem by problem, no coordination of baselines), then on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from kernelagent.bench import BenchSpec, Session, discover, find_candidates, run_bench  # noqa: E402
from kernelagent.bench.store import Store  # noqa: E402
from kernelagent.harness.caller.pool import visible_gpus  # noqa: E402
from kernelagent.bench.cost import _num, cost as cost_of, held_s  # noqa: E402


def build_candidates(target: Path, pattern: str | None, samples: int) -> int:
    """CDIR/<level>/<stem>/sample_<i>.py for every problem with a solution; returns the count."""
    n = 0
    for ref in discover(HERE, pattern=pattern):
        found = find_candidates(HERE / "solutions", ref)
        if not found:
            continue
        source = found[0].read_text(encoding="utf-8")
        folder = target / ref.level / ref.name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(samples):
            (folder / f"sample_{i}.py").write_text(f"# throughput sample {i}\n{source}", encoding="utf-8")
            n += 1
    return n


def shared_baselines(gpus: str, work: Path, args: argparse.Namespace) -> tuple[Path, dict]:
    """--baselines shared: the cache folder every row seeds its baselines from, and what was done.
    With --baselines-dir holding entries already (an earlier call's, on the same GPU model and
    versions: consecutive calls of one measurement), those; else an uncounted warm-up of one sample
    per problem on `gpus` times them, and --baselines-dir (if named) keeps them for the next call."""
    kept = Path(args.baselines_dir) if args.baselines_dir else None
    if kept is not None and baseline_entries(kept):
        entries = len(baseline_entries(kept))
        print(f"baselines: shared, {entries} entries read from {kept}; every row's fresh cache starts with them",
              flush=True)
        return kept, {"from": str(kept), "entries": entries, "digest": entries_digest(kept)}
    warm = measure(gpus, build_warmup(work, args.filter), args.filter, work, args.trials, name="baselines-warmup")
    source = work / "cache-baselines-warmup"
    entries = len(baseline_entries(source))
    if kept is not None:
        seed_baselines(source, kept)
    print(f"baselines: shared, timed once in an uncounted warm-up on {gpus} ({warm['evaluations']} evaluations in "
          f"{warm['wall_s']:.1f} s, {entries} entries{f', kept in {kept}' if kept else ''}); every row's fresh "
          "cache starts with them", flush=True)
    return source, {"gpus": gpus, "evaluations": warm["evaluations"], "wall_s": warm["wall_s"],
                    "baselines_timed": warm["host_profile"]["baselines_timed"], "entries": entries,
                    "kept_in": str(kept) if kept else None, "digest": entries_digest(source)}


def entries_digest(cache: Path) -> str:
    """A digest of a cache folder's baselines' entries (names and bytes): two calls' rows read the
    same baselines when their digests match (--join says so where they do not)."""
    digest = hashlib.sha256()
    for entry in baseline_entries(cache):
        digest.update(entry.name.encode() + b"\0" + entry.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def baseline_entries(cache: Path) -> list[Path]:
    """A cache folder's baselines' entries (baselines/<key>.json: no lock, no other folder), sorted."""
    return sorted((cache / "baselines").glob("*.json"))


def build_warmup(work: Path, pattern: str | None) -> Path:
    """One candidate per problem (the first sample's text) for --baselines shared's warm-up."""
    folder = work / "warmup-candidates"
    build_candidates(folder, pattern, 1)
    return folder


# The stages of the host-time profile, in the order they happen (stage_seconds' names).
STAGES = ("server_start", "baseline_wait", "start", "derive", "load", "compile", "correctness", "timing",
          "post-check", "baselines", "start_to_reply", "total", "server_cpu")


def measure(gpus: str, cdir: Path, pattern: str | None, work: Path, trials: int, tuning: bool = True,
            pin: bool = True, *, name: str = "", baselines_from: Path | None = None, jobs_per_gpu: int = 0) -> dict:
    """One row: the batch of `cdir` on `gpus` in a fresh store and a fresh cache; `baselines_from`
    (a cache folder) seeds that cache with its baselines' entries only (--baselines shared)."""
    # "cpu:N": N CPU workers; else GPU indices.
    cpu_workers = int(gpus.split(":")[1]) if gpus.startswith("cpu:") else None
    tag = name or (gpus.replace(",", "_").replace(":", "") + ("" if tuning else "-untuned")
                   + ("" if pin else "-unpinned"))
    store = work / f"store-{tag}.sqlite"
    cache = work / f"cache-{tag}"
    seeded = seed_baselines(baselines_from, cache) if baselines_from is not None else None
    spec = BenchSpec(root=str(HERE), candidates=str(cdir), filter=pattern, trials=trials)
    sys.path.insert(0, str(HERE))
    from host_cpu import HostCpu

    started = time.monotonic()
    started_wall = time.time()
    # Where the host's CPU goes, by process kind (servers, references, candidates, Inductor's
    # compile workers, ncu, the toolchain), sampled from /proc below this process: issue 44.
    with HostCpu(interval=0.5) as sampler:
        # daemon=False: servers of this batch's own, whatever KERNELAGENT_DAEMON says (`kernelagent
        # bench` uses this user's warm harness per device by default): the wall measured here
        # includes each server's start, and the host sampler must find the servers below this
        # process; a warm harness would carry another run's caches and processes into the batch.
        outcome = run_bench(spec, Session(gpus="cpu" if cpu_workers else gpus, cpu_workers=cpu_workers or 1,
                                          store=str(store), cache_dir=str(cache), out=str(work / f"run-{tag}"),
                                          host_tuning=tuning, pin_cpus=pin, daemon=False,
                                          jobs_per_gpu=jobs_per_gpu))
    wall = time.monotonic() - started
    sampled = sampler.report(max(outcome.evaluations, 1))
    machine_cpu = sampled["machine_cpu_s"]  # every process on the host meanwhile
    with Store(store) as db:
        log = db.evaluation_log(outcome.run_id)
        attempts = db.attempts(outcome.run_id)
        rows = db._query("SELECT e.result, l.device, l.seconds, l.created FROM evaluation_log l "
                         "JOIN evaluations e ON e.key = l.key WHERE l.run_id = ?", (outcome.run_id,))
        results = [json.loads(r["result"]) for r in rows]
        ends = [(r["device"], r["seconds"], r["created"]) for r in rows]
    n_gpus = cpu_workers or len(gpus.split(","))
    cost = cost_of(results, wall)
    eval_seconds = sum(r["seconds"] or 0.0 for r in log)
    by_problem = evidence_by_problem(results)
    return {"gpus": gpus, "n_gpus": n_gpus, "host_tuning": tuning, "pinned": bool(tuning and pin),
            "baselines_seeded": seeded, "jobs_per_gpu": jobs_per_gpu or "the server's default",
            "evaluations": outcome.evaluations,
            "reused": outcome.reused,
            "wall_s": round(wall, 2), "evaluations_per_gpu_minute": round(outcome.evaluations / (wall / 60) / n_gpus, 3),
            "evaluations_per_minute": round(outcome.evaluations / (wall / 60), 3),
            "sum_of_evaluation_seconds": round(eval_seconds, 2),
            "machine_cpu_s_per_evaluation": round(machine_cpu / max(outcome.evaluations, 1), 2),
            "host_cpu": {k: sampled[k] for k in ("machine_cpu_s", "sampled_cpu_s", "reaped_cpu_s",
                                                  "sampled_cpu_s_per_evaluation", "by_kind") if k in sampled},
            # each job's own processes, its evidence session and its server thread (bench/cost.py)
            "cost": cost,
            "host_profile": {**host_profile(results, wall, n_gpus, eval_seconds),
                             "store_s": round(outcome.store_seconds, 4)},
            "timeline": timeline(results, ends, started_wall),
            "evidence_by_problem": by_problem,
            # Results Nsight Compute audited: bench audits its counted wins, so a problem about as
            # fast as Inductor is audited in one row and not the next, and each audit holds the slot.
            "audits": audits_of(by_problem),
            "calibrations": calibrations_of(results),
            "slot_per_evaluation": slot_per_evaluation(cost, outcome.evaluations),
            "retried": retried(results),
            "correct_samples": sum(1 for a in attempts if a["summary"].get("passed")),
            "statuses": _counts(a["summary"].get("status") for a in attempts),
            "metrics": {k: outcome.metrics[k] for k in ("problems", "correct", "correctness_rate", "fast_p",
                                                         "geomean_speedup")}}


def seed_baselines(source: Path, cache: Path) -> int:
    """Copy the baselines' entries of the cache folder `source` (baselines/<key>.json, nothing
    else: no lock, no calibration, no compile cache) into the fresh cache folder `cache`; how many.
    The entries are keyed by the GPU's model, the driver and the versions (caller/baseline_cache.py),
    so a row on other GPUs of the same model reads them and a row on another model misses."""
    target = cache / "baselines"
    target.mkdir(parents=True, exist_ok=True)
    entries = baseline_entries(source)
    for entry in entries:
        shutil.copyfile(entry, target / entry.name)
    return len(entries)


def scalings(rows: list[dict]) -> dict[str, dict]:
    """Each row on N > 1 devices against the row on one device measured the same way (host tuning,
    pinning, GPUs or CPU workers): `scaling_1_to_N` (+ `_untuned`, `_unpinned`) with the speedup on
    the batch's wall, the efficiency (speedup / N), the pace after the fill and in the steady state,
    ncu's per-call agreement and each row's audits."""
    out: dict[str, dict] = {}
    for tuning, pin in ((False, True), (True, True), (True, False)):
        one = next((r for r in rows if r["n_gpus"] == 1 and r["host_tuning"] == tuning), None)
        if one is None:
            continue
        for many in rows:
            if many["n_gpus"] < 2 or many["host_tuning"] != tuning or many["pinned"] != (tuning and pin) \
                    or many["gpus"].startswith("cpu") != one["gpus"].startswith("cpu"):
                continue
            n = many["n_gpus"]
            speedup = one["wall_s"] / many["wall_s"]
            name = f"scaling_1_to_{n}" + ("" if tuning else "_untuned") + ("" if pin else "_unpinned")
            paces = [r["timeline"].get("completion_s_per_first_try") for r in (one, many)]
            steadies = [r["timeline"].get("steady_s_per_evaluation") for r in (one, many)]
            out[name] = {"devices": n, "speedup": round(speedup, 3), "efficiency": round(speedup / n, 3),
                         "after_the_fill": round(paces[0] / paces[1], 3) if all(paces) else None,
                         "steady_state": round(steadies[0] / steadies[1], 3) if all(steadies) else None,
                         "evidence_gap_pct": evidence_agreement(one, many),
                         "audits": [one.get("audits"), many.get("audits")],
                         "first_results_s": [one["timeline"].get("first_end_s"), many["timeline"].get("first_end_s")],
                         "host_tuning": tuning, "pinned": pin}
    return out


def print_scalings(rows: list[dict]) -> dict[str, dict]:
    """scalings(rows), each printed on a line."""
    found = scalings(rows)
    for scale in found.values():
        n, audits = scale["devices"], scale["audits"]
        agreement = scale["evidence_gap_pct"]
        print(f"1 -> {n} GPUs (host tuning {'on' if scale['host_tuning'] else 'off'}"
              f"{'' if scale['pinned'] else ', unpinned'}): {scale['speedup']:.2f}x faster, scaling efficiency "
              f"{scale['efficiency']:.0%}; after the fill {scale['after_the_fill']}x (the pace of evaluations "
              f"not re-run alone); steady state {scale['steady_state']}x (queued starts from the first end to "
              f"the last start); first result at {scale['first_results_s'][0]} s against "
              f"{scale['first_results_s'][1]} s; ncu per call, {n} GPUs against 1: largest gap "
              f"{agreement['largest_pct']}% {agreement['gaps_pct']}; audits {audits[0]} on 1 GPU, "
              f"{audits[1]} on {n}" + (" (not the same work: compare with care)" if audits[0] != audits[1] else ""),
              flush=True)
    return found


def join(paths: list[str], out: str) -> None:
    """--join: the rows of several outputs (consecutive calls of one measurement, each row's cache
    seeded from the same kept baselines) compared as if measured in one call. Outputs of different
    candidates (count, samples, filter) are refused: their rows are not the same work."""
    outputs = [json.loads(Path(p).read_text()) for p in paths]
    work = {(o.get("candidates"), o.get("samples"), o.get("filter")) for o in outputs}
    if len(work) != 1:
        sys.exit(f"bench_throughput: --join: the outputs are not of the same candidates {sorted(map(str, work))}")
    rows = [row for o in outputs for row in o.get("rows", [])]
    digests = {(o.get("baselines_warmup") or {}).get("digest") for o in outputs}
    result = {**{k: outputs[0].get(k) for k in ("candidates", "samples", "filter")}, "joined": paths, "rows": rows,
              "baselines": [o.get("baselines_warmup") for o in outputs]}
    if None in digests or len(digests) != 1:
        print("the outputs' rows did not all read the same kept baselines: compare with care", flush=True)
    result.update(print_scalings(rows))
    Path(out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"written: {out}")


def host_profile(results: list[dict], wall: float, n_gpus: int, eval_seconds: float) -> dict:
    """Where the time went: each stage summed over the evaluations, the evaluations that timed
    baselines themselves, the harness's CPU seconds and each GPU's time outside evaluations."""
    stages: dict[str, float] = {}
    for result in results:
        for name, seconds in (result.get("stage_seconds") or {}).items():
            if isinstance(seconds, (int, float)):
                stages[name] = stages.get(name, 0.0) + float(seconds)
    ordered = {name: round(stages[name], 2) for name in STAGES if name in stages}
    ordered.update({name: round(v, 2) for name, v in sorted(stages.items()) if name not in ordered})
    return {"stage_seconds_sum": ordered,
            "baselines_timed": sum(1 for r in results if "baselines" in (r.get("stage_seconds") or {})),
            "baselines_cached": sum(1 for r in results if r.get("baselines_cached")),
            # Counted by each server around each job (its own and its reaped job processes'): with
            # several jobs at once each span holds its neighbours' CPU too, so this sum counts the
            # same seconds several times over (the per-evaluation figures are cost's
            # host_cpu_s_per_evaluation and the row's host_cpu).
            "harness_cpu_s": round(stages.get("server_cpu", 0.0), 1),
            # Nsight Compute sessions: the evaluations that had one, and how many of those took
            # over a spare started ahead (host_cpu's ncu 'processes' is how many were started).
            "evidence_sessions": _evidence_sessions(results),
            "gpu_idle_s": round(max(0.0, wall - eval_seconds / n_gpus), 2)}


# A span's stage clocks: where a cold wave's first evaluations spent the fill.
SPAN_STAGES = ("server_start", "start", "load", "compile", "correctness", "timing", "post-check", "baselines",
               "evidence", "baseline_wait", "first_try")


def timeline(results: list[dict], ends: list[tuple], started_wall: float) -> dict:
    """When each evaluation ran, from the run's start (s): [device, problem, start, end, its
    slot seconds, its baseline wait, its stage clocks, re-run alone] by start; the fill (the
    first evaluation's end) and the drain (from the last start to the end), the parts of a batch
    that more GPUs do not shorten; and the seconds per evaluation between the first end and the
    last, over every evaluation and over those not re-run alone (the batch's pace once the fill
    is over: its ratio between two rows is the scaling the fill hides)."""
    spans = []
    for result, (device, seconds, created) in zip(results, ends):
        if not isinstance(created, (int, float)) or not isinstance(seconds, (int, float)):
            continue
        conc = result.get("concurrency") or {}
        slot = held_s(result)
        stages = result.get("stage_seconds") or {}
        # the GPU's name is the same on both of a pair: its UUID's end tells them apart
        uuid = str((result.get("fingerprint") or {}).get("uuid") or "")
        spans.append([str(device) + (f" {uuid[-6:]}" if uuid else ""), Path(str(result.get("problem") or "?")).stem,
                      round(created - seconds - started_wall, 2), round(created - started_wall, 2),
                      round(slot, 2), round(_num(stages.get("baseline_wait")), 2),
                      {k: round(_num(stages[k]), 2) for k in SPAN_STAGES if k in stages},
                      bool(conc.get("retried_alone"))])
    spans.sort(key=lambda s: s[2])
    if not spans:
        return {"spans": [], "first_end_s": None, "last_start_s": None, "end_s": None,
                "completion_s_per_evaluation": None, "completion_s_per_first_try": None,
                "steady_s_per_evaluation": None, "steady_starts": 0}

    def pace(chosen: list[list]) -> float | None:
        ends_ = sorted(s[3] for s in chosen)
        return round((ends_[-1] - ends_[0]) / (len(ends_) - 1), 3) if len(ends_) > 1 else None

    first_end, last_start = min(s[3] for s in spans), spans[-1][2]
    # The steady state: every job started after the first end was started because one ended
    # (the first wave's jobs start at once), so starts from then to the last (the queue empty)
    # come at the rate evaluations end once the fill is over and before the drain; in that
    # window each row has its whole first wave in flight at both ends, so the rate is not
    # flattered by the fill's head start (its ratio between two rows: the scaling at scale).
    queued = [s[2] for s in spans if s[2] > first_end]
    steady = round((last_start - first_end) / len(queued), 3) if len(queued) >= 2 else None
    return {"spans": spans, "baselines_jobs": baselines_jobs(results, started_wall),
            "per_device": per_device(spans, first_end),
            "first_end_s": first_end, "last_start_s": last_start,
            "end_s": max(s[3] for s in spans), "completion_s_per_evaluation": pace(spans),
            "completion_s_per_first_try": pace([s for s in spans if not s[7]]),
            "steady_s_per_evaluation": steady, "steady_starts": len(queued)}


# What a device's steady-state jobs are compared by (docs: one GPU's server was the slower of two
# in three readings, its latency 20.9 s against 14.6 s): the driver's lock shows in `start`, the
# host's CPU in `compile` and `correctness`, the GPU and the slot's queue in `timing`.
DEVICE_STAGES = ("start", "load", "compile", "correctness", "timing", "evidence")


def per_device(spans: list[list], first_end: float) -> dict[str, dict]:
    """Per device, the jobs that started after the first result (the steady state and the drain,
    not the cold first wave; none re-run alone): how many, their mean latency (start to result),
    their mean stage clocks (a stage a job did not reach counts as 0) and slot seconds. Two
    devices' servers doing the same work should read alike; where one reads slower, its stages
    say whether the driver, the host or the GPU."""
    out: dict[str, dict] = {}
    for device in sorted({s[0] for s in spans}):
        chosen = [s for s in spans if s[0] == device and s[2] > first_end and not s[7]]
        if not chosen:
            continue
        n = len(chosen)
        out[device] = {"jobs": n, "latency_s": round(sum(s[3] - s[2] for s in chosen) / n, 2),
                       "slot_s": round(sum(s[4] for s in chosen) / n, 2),
                       "stages_s": {k: round(sum(s[6].get(k, 0.0) for s in chosen) / n, 2) for k in DEVICE_STAGES
                                    if any(k in s[6] for s in chosen)}}
    return out


def baselines_jobs(results: list[dict], started_wall: float) -> list[list]:
    """Each problem's baselines' job (the first evaluation of a problem starts it beside its own
    job): [problem, start, end (s from the run's start), its Inductor compile, its wait for the
    timing slot and its time holding it (s)], by start: the fill's first results wait for these."""
    jobs = []
    for result in results:
        job = (result.get("concurrency") or {}).get("baselines_job")
        span = job.get("span") if isinstance(job, dict) else None
        if not (isinstance(span, list) and len(span) == 2 and all(isinstance(t, (int, float)) for t in span)):
            continue
        stages, slot = job.get("stage_seconds") or {}, job.get("slot") or {}
        jobs.append([Path(str(result.get("problem") or "?")).stem, round(span[0] - started_wall, 2),
                     round(span[1] - started_wall, 2), round(_num(stages.get("baselines_compile")), 2),
                     round(_num(slot.get("wait_s")), 2), round(_num(slot.get("held_s")), 2)])
    return sorted(jobs, key=lambda j: j[1])


def retried(results: list[dict]) -> list[dict]:
    """The evaluations re-run alone after their first try beside others (a stage past its limit,
    a full device): what that first try met (caller/results.py first_try_summary), which a
    batch's wall waits for."""
    out = []
    for result in results:
        conc = result.get("concurrency") or {}
        first = conc.get("first_try")
        if not conc.get("retried_alone") or not isinstance(first, dict):
            continue
        stages = first.get("stage_seconds") if isinstance(first.get("stage_seconds"), dict) else {}
        out.append({"problem": Path(str(result.get("problem") or "?")).stem, "status": result.get("status"),
                    "first_try": {"status": first.get("status"), "stage": first.get("stage"),
                                  "reason": str(first.get("reason") or "")[:300],
                                  "stage_seconds": {k: v for k, v in stages.items() if k in STAGES + (
                                      "admitted_to_result", "total_server", "evidence", "baseline_wait")},
                                  # its waits: the fork's, the memory estimate's, the admission's
                                  "concurrency": first.get("concurrency") if isinstance(
                                      first.get("concurrency"), dict) else {},
                                  "at_limit": first.get("at_limit")}})
    return out


def calibrations_of(results: list[dict]) -> dict:
    """The timed loops' calibrations (result.timed_loop): how many loops had one, how many were
    measured in the slot before a loop, how many measured again after one (and how many took
    another server's second measure instead), how many were read from another server of the host
    (calibration_store.py), and on how many loops another server's plan ran. One GPU measures
    each problem's once (and again at most once); N GPUs should not measure more (issue 59)."""
    loops = [r.get("timed_loop") for r in results]
    loops = [t for t in loops if isinstance(t, dict) and t.get("calibration_s") is not None]
    again = [t for t in loops if "calibrations_s" in t]
    return {"loops": len(loops), "measured": sum(1 for t in loops if not t.get("calibration_reused")),
            "measured_again": sum(1 for t in again if not t.get("recalibration_shared")),
            "again_another_servers": sum(1 for t in again if t.get("recalibration_shared")),
            "another_servers": sum(1 for t in loops if t.get("calibration_shared")),
            "plans_another_servers": sum(1 for t in loops if t.get("plan_shared"))}


def slot_per_evaluation(cost: dict, evaluations: int) -> dict:
    """The slot held per evaluation, with and without the evidence sessions' holds (the audits:
    their count varies between rows, as the wins near Inductor's time go one way or the other).
    A device's pace is about this plus the rest of a job's work over the jobs it runs at once."""
    held, parts = float(cost.get("slot_held_s") or 0.0), cost.get("slot_parts_s") or {}
    n, evidence = max(evaluations, 1), float(parts.get("evidence_s") or 0.0)
    return {"all_s": round(held / n, 3), "without_evidence_s": round((held - evidence) / n, 3)}


def audits_of(by_problem: dict) -> int:
    """The results Nsight Compute audited (evidence_by_problem's `ncu_n`, summed)."""
    return sum(entry["ncu_n"] for entry in by_problem.values())


def evidence_by_problem(results: list[dict]) -> dict:
    """Per problem: the median of Nsight Compute's kernel time per call (the evidence's third
    clock) and of the harness's candidate median, with how many evaluations gave each, and the
    evidence flags raised. Two rows' medians agreeing says that sessions profiling at once on
    two GPUs read the same kernels as one GPU's did."""
    import statistics

    out: dict = {}
    for result in results:
        name = Path(str(result.get("problem") or "?")).stem
        entry = out.setdefault(name, {"ncu_ms": [], "harness_ms": [], "flags": 0, "locks": []})
        evidence = result.get("kernel_evidence") or {}
        if isinstance(evidence.get("per_call_ms"), (int, float)):
            entry["ncu_ms"].append(float(evidence["per_call_ms"]))
        if evidence.get("ncu_lock") and evidence["ncu_lock"] not in entry["locks"]:
            entry["locks"].append(evidence["ncu_lock"])
        candidate = (result.get("timings") or {}).get("candidate") or {}
        if isinstance(candidate.get("median_ms"), (int, float)):
            entry["harness_ms"].append(float(candidate["median_ms"]))
        entry["flags"] += sum(1 for f in result.get("flags") or []
                              if str(f.get("kind", "")).startswith(("kernel-evidence", "ncu", "evidence")))
    return {name: {"ncu_ms": round(statistics.median(e["ncu_ms"]), 5) if e["ncu_ms"] else None,
                   "ncu_n": len(e["ncu_ms"]),
                   "harness_ms": round(statistics.median(e["harness_ms"]), 5) if e["harness_ms"] else None,
                   "evidence_flags": e["flags"], "ncu_lock": e["locks"]}
            for name, e in sorted(out.items())}


def evidence_agreement(one: dict, two: dict) -> dict:
    """Per problem, the second row's ncu median over the first's, minus 1 (%), and the largest."""
    gaps = {}
    for name, a in one.get("evidence_by_problem", {}).items():
        b = two.get("evidence_by_problem", {}).get(name) or {}
        if a.get("ncu_ms") and b.get("ncu_ms"):
            gaps[name] = round(100 * (b["ncu_ms"] / a["ncu_ms"] - 1), 2)
    return {"gaps_pct": gaps, "largest_pct": max((abs(g) for g in gaps.values()), default=None)}


def _evidence_sessions(results: list[dict]) -> dict:
    phases = [(r.get("kernel_evidence") or {}).get("phases") for r in results]
    phases = [p for p in phases if isinstance(p, dict)]
    return {"evaluations_with_evidence": len(phases), "from_spares": sum(1 for p in phases if p.get("spare"))}


def _counts(values) -> dict:
    out: dict = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="throughput.json")
    parser.add_argument("--samples", type=int, default=2, help="distinct copies of each solution (default 2)")
    parser.add_argument("--gpu-sets", nargs="+", default=["0", "0,1"],
                        help="GPU sets to measure, in order ('cpu:N': N CPU workers, for tests)")
    parser.add_argument("--filter", default=None, help="glob over problem keys, e.g. 'level1/*'")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the work folder (stores, reports)")
    parser.add_argument("--baselines", choices=("fresh", "shared"), default="fresh",
                        help="fresh (default): each row times its own baselines in its fresh cache; shared: an "
                             "uncounted warm-up (one sample of each problem on the first set) times them once and "
                             "every row's fresh cache starts with those entries, so every row compares against "
                             "the same baselines (the same wins, so the same audits) and none waits for Inductor")
    parser.add_argument("--baselines-dir", default=None,
                        help="--baselines shared: a folder whose baselines/ entries every row reads; where it has "
                             "none yet, the warm-up's are kept there (the next call of the measurement reads them)")
    parser.add_argument("--unpinned", action="store_true",
                        help="measure each multi-GPU set a second time with every server on every CPU "
                             "(the host tuning without its CPU split)")
    parser.add_argument("--compare", action="store_true",
                        help="measure each GPU set with the host tuning off, then on (before/after in one call)")
    parser.add_argument("--overlap", action="store_true",
                        help="one device: serial against overlapped evaluation, and a spinner neighbour (overlap.py)")
    parser.add_argument("--jobs", type=int, default=0, help="--overlap: jobs at once (0: the server's default)")
    parser.add_argument("--jobs-per-gpu", type=int, default=0,
                        help="each row: evaluations each device's server runs at once (0: the server's default)")
    parser.add_argument("--spinners", type=int, default=2, help="--overlap: hostile spinner neighbours (0: none)")
    parser.add_argument("--no-kernel-evidence", action="store_true",
                        help="--overlap: turn the out-of-process kernel evidence off (it is on by default on a GPU)")
    parser.add_argument("--join", nargs="+", default=None, metavar="OUTPUT",
                        help="measure nothing: compare the rows of these outputs (consecutive calls of one "
                             "measurement) and write the scalings to --out")
    args = parser.parse_args()
    if args.join:
        join(args.join, args.out)
        return
    if args.overlap:
        from overlap import compare, print_table

        work = Path(tempfile.mkdtemp(prefix="kernelagent-overlap-"))
        try:
            out = compare(args.filter, args.samples, args.trials, args.jobs, args.spinners, work, Path(args.out),
                          kernel_evidence=not args.no_kernel_evidence)
            print_table(out)
            Path(args.out).write_text(json.dumps(out, indent=2, default=str) + "\n")
            print(f"written: {args.out}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return

    visible = visible_gpus()
    # "cpu:N": N CPU harness workers (Triton's interpreter: the pipeline's test, timings not
    # meaningful).
    sets = [s for s in args.gpu_sets if re.fullmatch(r"cpu:[1-9]\d*", s)
            or (visible and re.fullmatch(r"\d+(,\d+)*", s) and all(int(i) in visible for i in s.split(",")))]
    if not sets:
        sys.exit(f"no GPU set of {args.gpu_sets} is visible (visible GPUs: {visible or 'none'})")
    work = Path(tempfile.mkdtemp(prefix="kernelagent-throughput-"))
    try:
        cdir = work / "candidates"
        n = build_candidates(cdir, args.filter, args.samples)
        print(f"{n} candidates ({args.samples} per solution), GPU sets {sets}", flush=True)
        rows: list[dict] = []
        result: dict = {"candidates": n, "samples": args.samples, "filter": args.filter, "rows": rows}
        baselines_from = None
        if args.baselines == "shared":
            baselines_from, result["baselines_warmup"] = shared_baselines(sets[0], work, args)
        plan = [(tuning, gpus, True) for tuning in ([False, True] if args.compare else [True]) for gpus in sets]
        if args.unpinned:
            plan += [(True, gpus, False) for gpus in sets if "," in gpus or (gpus.startswith("cpu:") and gpus != "cpu:1")]
        for tuning, gpus, pin in plan:
            row = measure(gpus, cdir, args.filter, work, args.trials, tuning=tuning, pin=pin,
                          baselines_from=baselines_from, jobs_per_gpu=args.jobs_per_gpu)
            rows.append(row)
            # each row kept as it ends: a call cut short by its time limit keeps the rows it finished
            Path(args.out).write_text(json.dumps({**result, "partial": True}, indent=2, default=str) + "\n")
            line = row["timeline"]
            profile = row["host_profile"]
            slot, cal = row["slot_per_evaluation"], row["calibrations"]
            kinds = ", ".join(f"{k} {v['cpu_s']} s/{v['processes']}p"
                              for k, v in row["host_cpu"].get("by_kind", {}).items())
            print(f"GPUs {gpus} (host tuning {'on' if tuning else 'off'}{'' if pin else ', unpinned'}): "
                  f"{row['evaluations']} evaluations "
                  f"in {row['wall_s']:.1f} s = {row['evaluations_per_gpu_minute']:.2f} evaluations per "
                  f"GPU-minute ({row['evaluations_per_minute']:.2f} per minute); correct "
                  f"{row['correct_samples']}/{row['evaluations'] + row['reused']}; statuses {row['statuses']}\n"
                  f"  host CPU per evaluation: {row['machine_cpu_s_per_evaluation']} s on the machine, "
                  f"{row['cost']['host_cpu_s_per_evaluation']} s in the job's own processes; by kind "
                  f"{kinds} "
                  f"(the servers' overlapping per-job sum: {profile['harness_cpu_s']} s)\n"
                  f"  GPU idle {profile['gpu_idle_s']} s each, store {profile['store_s']} s, "
                  f"baselines timed {profile['baselines_timed']}x; evidence {profile['evidence_sessions']}; "
                  f"stage sums {profile['stage_seconds_sum']}\n"
                  f"  slot held {row['cost']['slot_held_s']} s ({row['cost']['slot_busy_share']:.0%} of the "
                  f"devices' wall), parts {row['cost']['slot_parts_s']}\n"
                  f"  slot per evaluation {slot['all_s']} s ({slot['without_evidence_s']} s without the evidence "
                  f"sessions' holds); calibrations of {cal['loops']} loops: {cal['measured']} measured, "
                  f"{cal['measured_again']} measured again ({cal['again_another_servers']} more took another "
                  f"server's second), {cal['another_servers']} read from another server; "
                  f"{cal['plans_another_servers']} loops ran another server's plan\n"
                  f"  fill: first evaluation ended at {line['first_end_s']} s; last started at "
                  f"{line['last_start_s']} s, ended at {line['end_s']} s; then one ended every "
                  f"{line['completion_s_per_evaluation']} s ({line['completion_s_per_first_try']} s without "
                  f"those re-run alone); steady state: one started every {line['steady_s_per_evaluation']} s "
                  f"({line['steady_starts']} queued starts)\n"
                  "  per device, jobs started after the first result (mean latency s; slot s; stages s): "
                  + ("; ".join(f"{d}: {v['jobs']} jobs, {v['latency_s']}; {v['slot_s']}; {v['stages_s']}"
                               for d, v in line["per_device"].items()) or "none") + "\n"
                  "  baselines' jobs (problem start-end s: compile, slot wait, slot held): "
                  + ("; ".join(f"{p} {a}-{b}: {c}, {w}, {h}" for p, a, b, c, w, h in line["baselines_jobs"])
                     or "none") + "\n"
                  "  re-run alone after a first try beside others: "
                  + ("none" if not row["retried"] else "; ".join(
                      f"{r['problem']} ({r['first_try']['status']} at {r['first_try']['stage']}: "
                      f"{r['first_try']['reason'][:160]}; stages {r['first_try']['stage_seconds']}; "
                      f"waits {r['first_try']['concurrency']}; processes {r['first_try']['at_limit']})"
                      for r in row["retried"])) + "\n"
                  f"  audits (results Nsight Compute ran on): {row['audits']}; "
                  f"evidence by problem (ncu ms/call, harness ms, flags): "
                  + "; ".join(f"{k} {v['ncu_ms']}/{v['harness_ms']}/{v['evidence_flags']}"
                              for k, v in row["evidence_by_problem"].items()),
                  flush=True)
        result.update(print_scalings(rows))
        Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"written: {args.out}" + (f"; work folder kept: {work}" if args.keep else ""))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
