"""How repeatable is a speedup? The same candidates, evaluated again and again.

The first `--fresh` repetitions of each problem (default 1) run `python -m kernelagent eval
PROBLEM CANDIDATE --json --cache-dir DIR` as a subprocess of their own, so each starts a new
harness server (new CUDA context, new allocator, new Inductor compile unless cached): the spread
a user sees between two `eval`s. The others run in one warm harness server in this process
(`Evaluator`, a fresh candidate and reference process per evaluation, as `bench` and the RL
reward run them), which costs seconds instead of the ~25 s of a fresh process, so a whole table
fits one device call. Up to `--jobs N` warm evaluations (default 8) are in flight at once: the
server overlaps their host work (imports, compiles, checks) while each timed loop holds the
device alone, a prime never runs beside a repetition (and at most `--prime-jobs` primes, default
4, run at once: they compile cold), and up to `--fresh-jobs` fresh processes
(default 3) are in flight at once, a new one starting as each ends: their servers' starts overlap,
and each server takes the GPU's host-wide lock for its job (server/device_lock.py), so no two
servers time on the device at once. Each
row says which (`process`: fresh or warm), and the table compares the two (`fresh/warm`). Issue
13, scope 1; issue 25, scope 2; issue 42 (both tables in one 8-minute device call each).

    python benchmarks/fidelity.py --out fid.jsonl --summary fid.md [--reps 5] [--fresh 1] [--cache on|off|both]
        [--filter 'kb/*'] [--pair PROBLEM:CANDIDATE[@name=value,...]]... [--pairs FILE]
        [--device auto] [--resume] [--max-minutes M] [--eval-timeout S] [--no-prime] [--jobs 8] [--prime-jobs 4]

Baseline cache: `on` shares one cache directory between all repetitions (the first, a "prime"
evaluation that is not counted, fills it, so the counted ones reuse stored eager/Inductor times);
`off` gives every repetition a fresh, empty cache directory, so the baselines are timed anew each
time. With `both` (the default) the two settings alternate within each problem.

Pairs: the default list runs from a ~5 us kernel to ~10 ms ones (our benchmarks/levelN problems
with benchmarks/solutions, KernelBench's with benchmarks/kernelbench_solutions; the KernelBench
ones are skipped, and say so, when ../shared/kernelbench is absent). `--pair` (repeatable) or
`--pairs FILE` (one pair a line, `#` comments) replace it; `--filter` is a glob over the labels.
`@name=value` overrides module-level sizes of the problem: the script writes a copy of the
problem with `name = value` appended (get_inputs reads the globals when called), which is how
the smallest kernels are made from the standard problems.

Output: `--out` gets one JSON row per evaluation, appended as soon as it finishes (a run cut
short keeps what it measured; `--resume` continues the same file and skips what is in it, which
is how a run is split over several calls that each have a time limit: see `--max-minutes`).
The Markdown table (stdout and `--summary`) covers every row in the file for the selected pairs.

Targets (issue 13): CV of the speedup over Inductor <= 1% for kernels of 50 us or more, <= 3% below.
On the CPU the script runs end to end, but every time is the Triton interpreter's wall clock:
the table says NOT MEANINGFUL and no target is judged.

Columns of the table (per problem and cache setting, over the counted repetitions):
  n            correct repetitions / counted repetitions
  cand ms      mean over repetitions of the candidate's median (timings.candidate.median_ms)
  CV cand      stdev/mean of those medians; likewise CV eager and CV Ind for the eager and
               Inductor (torch.compile default) baselines; with the cache on those come from the
               cache, so their CV is ~0 by construction
  x Ind        mean speedup over Inductor; CV x Ind its stdev/mean; target the limit that applies
               and whether it is met; x eager / CV x eager the same over eager
  interval     the median over repetitions of the speedup_intervals bounds (Inductor, else eager,
               marked "(eager)"); in int. how many repetitions' intervals contain the mean speedup
  q4/q1        drift within a run: median of the last quarter of the candidate's samples_ms over
               that of the first quarter (> 1: slower at the end, e.g. clocks throttling);
               median over repetitions, and the one farthest from 1
  last/first   the candidate median of the last counted repetition over the first's
  source       timings.candidate.source: in-process (the candidate's own per-call samples) or
               server (the server's clock over the timed loop)
  srv/claim    timed_loop.server_ms_per_call / timed_loop.claimed_mean_ms, median over repetitions
  cached       repetitions whose baselines came from the cache
  x dev        the mean speedup on the device clock (speedups_device: the kernel trace's time per
               call, candidate and baselines alike), "not recorded" where no row has one; CV x dev
               its stdev/mean, and target dev the same target judged on it (beside the wall
               clock's, never in its place; n/a where a repetition has no device figure)
  host share   the mean of per_call.host_share: the candidate's wall time per call the device ran
               none of its kernels; fresh/warm dev is fresh/warm on the device clock
A second table gives the GPU's SM clock, its maximum, temperature, power and (NVML) throttle
reasons, read before and after each repetition: from NVML (pynvml, else ctypes on
libnvidia-ml.so.1, which the GPU machines have without pynvml), else from nvidia-smi.

Time cap: `--max-minutes M` bounds the whole invocation (no evaluation starts unless the slowest
one so far still fits; each one's timeout is cut to the time left), and the plan is round robin
(all primes, then the warm repetitions one round at a time, then the fresh-process ones), so a
capped run has the same number of repetitions for every problem. The device clock (issue 58):
warm evaluations ask for the trace's kernel evidence alone (no Nsight Compute audit, audit_share
0), fresh ones run `eval --kernel-evidence` (whose wins eval audits with Nsight Compute: ~8 s per
win on an H200, 2026-11-26, when a whole default run of 11 pairs ran only its primes and fresh
repetitions in 7.4 minutes); `--no-device-clock` turns both off, and `--kernel-evidence` gives the
warm ones the default audit share too. Not yet measured on a GPU (2026-11-28).

Misses (issue 58, scope 3): a setting whose CV misses its target is re-run once alone (the same
pair, cache setting and process kind, nothing else in flight, within the cap; `--no-rerun` skips
it: a row with rep 0 and "rerun_alone": true, not counted), and carries a cause
(benchmarks/miss_cause.py) printed under "Misses and what they met" and appended to --out as a
"kind": "cause" line. Cost without it: a prime (baselines timed, Inductor compile
included) ~10-20 s, a warm repetition with cached baselines ~3-5 s, a fresh process ~12-15 s.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))  # gpu_clocks beside this script, however it was started
sys.path.insert(1, str(ROOT))  # the package from this checkout (the GPU machine has it uninstalled)
from gpu_clocks import gpu_index, nvml, read_clocks  # noqa: E402
from fidelity_table import SMALL_KERNEL_MS, cv, fmt, header_for, pct, render, summarize  # noqa: E402,F401 (re-exported)
from fidelity_rows import CONCURRENCY_KEYS, Pair, device_figures, make_row, quarter_drift  # noqa: E402,F401 (re-exported)
# KernelBench's problems: ../shared/kernelbench beside the checkout, or shared/kernelbench inside it
# (where the GPU machine's copy of the working tree puts it).
KERNELBENCH = next((p for p in (ROOT.parent / "shared" / "kernelbench" / "KernelBench",
                                ROOT / "shared" / "kernelbench" / "KernelBench") if p.is_dir()),
                   ROOT.parent / "shared" / "kernelbench" / "KernelBench")


class FidelityError(Exception):
    """Bad input: one line on stderr, exit 2."""


def default_pairs(kernelbench: Path) -> tuple[list[Pair], list[str]]:
    """The default list, smallest kernels first, and a note for each pair whose files are missing."""
    ours = [  # (label, level/stem, size overrides)
        ("ours/level1/1_relu@batch_size=128", "level1/1_relu", {"batch_size": 128}),
        ("ours/level1/5_softmax@batch_size=64", "level1/5_softmax", {"batch_size": 64}),
        ("ours/level1/17_max_dim", "level1/17_max_dim", {}),
        ("ours/level1/1_relu", "level1/1_relu", {}),
        ("ours/level1/5_softmax", "level1/5_softmax", {}),
        ("ours/level1/8_matmul", "level1/8_matmul", {}),
    ]
    pairs = [Pair("tests/relu_problem", ROOT / "tests/candidates/relu_problem.py",
                  ROOT / "tests/candidates/relu_good.py")]
    pairs += [Pair(label, HERE / f"{key}.py", HERE / "solutions" / f"{key}.py", dict(sizes))
              for label, key, sizes in ours]
    for key in ("level1/19_ReLU", "level1/23_Softmax", "level1/1_Square_matrix_multiplication_",
                "level1/3_Batched_matrix_multiplication"):
        pairs.append(Pair(f"kb/{key}", kernelbench / f"{key}.py", HERE / "kernelbench_solutions" / f"{key}.py"))
    kept, notes = [], []
    for pair in pairs:
        missing = [str(p) for p in (pair.problem, pair.candidate) if not p.is_file()]
        if missing:
            notes.append(f"skipped {pair.label}: not found: {', '.join(missing)}")
        else:
            kept.append(pair)
    return kept, notes


def parse_pair(spec: str) -> Pair:
    """PROBLEM:CANDIDATE[@name=value,...] -> Pair; paths relative to the current directory."""
    body, _, sizes = spec.partition("@")
    parts = body.split(":")
    if len(parts) != 2 or not all(parts):
        raise FidelityError(f"pair {spec!r}: expected PROBLEM:CANDIDATE[@name=value,...]")
    problem, candidate = (Path(p).resolve() for p in parts)  # the evals run in the repository root
    for path in (problem, candidate):
        if not path.is_file():
            raise FidelityError(f"pair {spec!r}: no such file: {path}")
    overrides: dict[str, int | float] = {}
    for item in filter(None, sizes.split(",")):
        name, eq, value = item.partition("=")
        try:
            number = ast.literal_eval(value) if eq else None
        except (ValueError, SyntaxError):
            number = None
        if not name.isidentifier() or isinstance(number, bool) or not isinstance(number, (int, float)):
            raise FidelityError(f"pair {spec!r}: size override {item!r} is not name=number")
        if not re.search(rf"^{re.escape(name)}\s*=", problem.read_text(), re.MULTILINE):
            raise FidelityError(f"pair {spec!r}: {problem.name} has no module-level {name} to override")
        overrides[name] = number
    label = problem.stem + (f"@{sizes}" if overrides else "")
    return Pair(label, problem, candidate, overrides)


def read_pairs_file(path: Path) -> list[Pair]:
    if not path.is_file():
        raise FidelityError(f"--pairs {path}: no such file")
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [parse_pair(line) for line in lines if line]


def problem_file(pair: Pair, work: Path) -> Path:
    """The problem as given, or a copy with its sizes overridden (written once, reused)."""
    if not pair.overrides:
        return pair.problem
    text = pair.problem.read_text().rstrip("\n") + "\n\n# benchmarks/fidelity.py: sizes overridden\n"
    text += "".join(f"{k} = {v!r}\n" for k, v in pair.overrides.items())
    path = work / "problems" / (re.sub(r"[^A-Za-z0-9_.=-]+", "_", pair.label) + ".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:  # whole or not at all: a wave's threads read it
        tmp = path.with_name(f".{path.name}.{threading.get_ident()}")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def run_eval(problem: Path, candidate: Path, cache_dir: Path, device: str, timeout: float,
             evidence: bool = False) -> tuple[int, dict | None, str, float]:
    """One evaluation in a fresh process: (exit code, parsed JSON or None, stderr tail, wall seconds)."""
    cmd = [sys.executable, "-m", "kernelagent", "eval", str(problem), str(candidate), "--json",
           "--cache-dir", str(cache_dir), "--device", device,
           "--kernel-evidence" if evidence else "--no-kernel-evidence"]
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return -1, None, f"timed out after {timeout:.0f} s\n{err[-1500:]}", time.perf_counter() - started
    wall = time.perf_counter() - started
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        data = None
    return proc.returncode, data if isinstance(data, dict) else None, proc.stderr[-1500:], wall


def run_eval_warm(evaluator, problem: Path, candidate: Path, cache: str,
                  evidence: bool | str = False) -> tuple[int, dict | None, str, float]:
    """One evaluation in the warm server: the same shape of answer as run_eval. Its own deadline
    is the harness's (stage limits); the cache setting is the config's (`off`: baselines timed
    anew, nothing read from the shared cache). `evidence`: True, the kernel evidence as eval asks
    for it; "trace", the trace's alone (no Nsight Compute audit), for the device clock (per_call)."""
    from kernelagent.harness import EvalConfig

    started = time.perf_counter()
    extra = {"audit_share": 0.0} if evidence == "trace" else {}
    try:
        result = evaluator.evaluate(problem, candidate.read_text(),
                                    EvalConfig(use_baseline_cache=cache == "on", kernel_evidence=bool(evidence),
                                               **extra))
    except Exception as exc:  # noqa: BLE001 - a row that says why, as a failed subprocess would
        return -1, None, f"{type(exc).__name__}: {exc}", time.perf_counter() - started
    data = json.loads(json.dumps(result.to_dict(), default=str))
    return (0 if result.passed else 1), data, "", time.perf_counter() - started


# -- main ---------------------------------------------------------------------------------------

def load_rows(path: Path) -> list[dict]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise FidelityError(f"{path}:{n}: not a JSON row ({exc.msg})") from None
    return rows


def run(args: argparse.Namespace) -> int:
    if args.reps < 1:
        raise FidelityError("--reps must be at least 1")
    if args.fresh < 0:
        raise FidelityError("--fresh must be 0 or more")
    if not 1 <= args.jobs <= 64:
        raise FidelityError("--jobs must be 1 to 64")
    if not 1 <= args.fresh_jobs <= 16:
        raise FidelityError("--fresh-jobs must be 1 to 16")
    if not 1 <= args.prime_jobs <= 64:
        raise FidelityError("--prime-jobs must be 1 to 64")
    notes: list[str] = []
    if args.pair or args.pairs:
        pairs = [parse_pair(p) for p in args.pair or []]
        pairs += read_pairs_file(args.pairs) if args.pairs else []
    else:
        pairs, notes = default_pairs(args.kernelbench)
    globs = [g.strip() for g in args.filter.split(",") if g.strip()] or ["*"]
    pairs = [p for p in pairs if any(fnmatch.fnmatch(p.label, g) for g in globs)]
    if not pairs:
        raise FidelityError(f"no pair matches --filter {args.filter!r}")
    if len({p.label for p in pairs}) != len(pairs):
        raise FidelityError("two pairs have the same label; give them different files or sizes")
    settings = ("on", "off") if args.cache == "both" else (args.cache,)

    out: Path = args.out.resolve()  # the evals run in the repository root: no relative paths
    existing = [r for r in load_rows(out) if r.get("kind") != "cause"] if out.is_file() else []
    if existing and not args.resume:
        raise FidelityError(f"{out} already has rows: pass --resume to continue it, or choose another --out")
    work = (args.work_dir or out.with_name(out.name + ".work")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    done = {(r["label"], r["cache"], r["rep"], bool(r.get("prime"))) for r in existing}
    run_id = time.strftime("%Y%m%dT%H%M%S")
    gpu = gpu_index(args.device)
    if shutil.which("nvidia-smi") is None and (gpu is None or nvml() is None):
        print("neither NVML nor nvidia-smi found: GPU clocks, temperature and power will not be read", flush=True)

    # Round robin: every pair's cache prime first, then repetition 1 of every pair and setting, then
    # repetition 2, ... A run cut by --max-minutes so has the same number of repetitions (within
    # one) for every problem, rather than all of the first problems and none of the last. The
    # fresh-process repetitions (1..--fresh, ~15-25 s each against ~3-5 s in the warm server)
    # come after the warm ones, so a capped run still has the warm spread of every problem.
    plan = []
    if "on" in settings and not args.no_prime:
        plan += [(pair, "on", 0, True) for pair in pairs]
    order = [rep for rep in range(1, args.reps + 1) if rep > args.fresh] + \
        [rep for rep in range(1, args.reps + 1) if rep <= args.fresh]
    plan += [(pair, cache, rep, False) for rep in order for pair in pairs for cache in settings]
    todo = [step for step in plan if (step[0].label, step[1], step[2], step[3]) not in done]
    print(f"{len(plan)} evaluations planned, {len(plan) - len(todo)} already in {out}; repetitions 1-{args.fresh} "
          "in fresh `python -m kernelagent eval` processes, the rest (and the primes) in one warm server",
          flush=True)
    warm = None  # the warm server, started with the first evaluation that needs it
    print(f"{'problem':44} {'cache':5} {'rep':>5} {'status':10} {'cand ms':>10} {'x Ind':>7} {'x eager':>8} "
          f"{'q4/q1':>6} {'wall s':>7} {'SM MHz':>9}", flush=True)

    started, stopped_early = time.perf_counter(), 0
    cache_on = work / "cache-on"
    # The cap holds for the whole invocation: an evaluation starts only if the slowest one seen so
    # far (per cache setting, primes count as "off": they time the baselines) still fits, and its
    # timeout is cut to the time left, so the run ends within --max-minutes plus the summary.
    slowest: dict[str, float] = {}
    lock = threading.Lock()

    running = [0]  # evaluations in flight now (this script's), for a miss's cause
    # The device clock (issue 58) needs the trace's evidence: warm evaluations ask for it alone
    # (no Nsight Compute audit), fresh ones run `eval --kernel-evidence` (whose wins eval audits).
    warm_evidence: bool | str = True if args.kernel_evidence else ("trace" if args.device_clock else False)
    fresh_evidence = bool(args.kernel_evidence or args.device_clock)

    def one(pair: Pair, cache: str, rep: int, prime: bool, process: str, eval_timeout: float) -> None:
        with lock:
            running[0] += 1
            in_flight = running[0]
        try:
            _one(pair, cache, rep, prime, process, eval_timeout, in_flight)
        finally:
            with lock:
                running[0] -= 1

    def _one(pair: Pair, cache: str, rep: int, prime: bool, process: str, eval_timeout: float,
             in_flight: int) -> None:
        problem = problem_file(pair, work)
        if cache == "on":
            cache_dir = cache_on
            cache_dir.mkdir(exist_ok=True)
        else:  # a fresh, empty directory: nothing cached, the baselines are timed again
            cache_dir = Path(tempfile.mkdtemp(prefix="cache-off-", dir=work))
        try:
            before = read_clocks(gpu)
            if process == "fresh":
                rc, data, stderr, wall = run_eval(problem, pair.candidate, cache_dir, args.device, eval_timeout,
                                                  fresh_evidence)
            else:
                rc, data, stderr, wall = run_eval_warm(warm, problem, pair.candidate, cache, warm_evidence)
            after = read_clocks(gpu)
        finally:
            if cache == "off":
                shutil.rmtree(cache_dir, ignore_errors=True)
        row = make_row(pair, cache, rep, prime, rc, data, stderr, wall, before, after, run_id, process, in_flight)
        with lock:
            kind = "off" if prime else cache
            slowest[kind] = max(slowest.get(kind, 0.0), wall)
            with out.open("a") as fh:  # after every evaluation: a run cut short keeps what it measured
                fh.write(json.dumps(row) + "\n")
            existing.append(row)
            clock = "—" if not before or before.get("clocks.sm") is None else f"{before['clocks.sm']:.0f}"
            print(f"{pair.label[:44]:44} {cache:5} {'prime' if prime else rep or 'alone':>5} {str(row['status'])[:10]:10} "
                  f"{fmt(row.get('candidate_ms'), '10.4g')} {fmt(row.get('speedup_compile'), '7.4g')} "
                  f"{fmt(row.get('speedup_eager'), '8.4g')} {fmt(row.get('drift_q4_q1'), '6.3f')} {wall:7.1f} "
                  f"{clock:>9}", flush=True)

    def pipeline(steps: list[tuple], workers: int, first: bool) -> int:
        """Run `steps` `workers` at a time, a new one starting as each ends (not in waves that wait
        for their slowest). Each starts only if the slowest evaluation of its kind so far still
        fits the cap (the run's very first always starts), with its timeout cut to the time left.
        Returns how many were left out for the cap (once one is, the rest are too)."""
        queue = list(enumerate(steps))
        left_out = 0

        def worker() -> None:
            nonlocal left_out
            while True:
                with lock:
                    if not queue:
                        return
                    position, step = queue.pop(0)
                    eval_timeout = args.eval_timeout
                    if args.max_minutes is not None:
                        left = args.max_minutes * 60 - (time.perf_counter() - started)
                        expected = slowest.get("off" if step[3] else step[1], max(slowest.values(), default=0.0))
                        if left <= 0 or (not (first and position == 0) and expected > left):
                            left_out += 1 + len(queue)
                            queue.clear()
                            return
                        eval_timeout = min(eval_timeout, max(left, 1.0))
                one(*step, eval_timeout)

        workers = max(1, min(workers, len(steps)))
        if workers == 1:
            worker()
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for future in [pool.submit(worker) for _ in range(workers)]:
                    future.result()
        return left_out

    # Phases, each a pipeline, one after another: the primes (--prime-jobs at a time: they compile
    # cold), the warm repetitions (--jobs at once in the one server, which overlaps their host
    # work while each timed loop holds the device alone; never beside their primes: a repetition
    # with the cache on must find its prime's baselines), and the fresh processes (--fresh-jobs at
    # once: each starts its own server, imports and probe, and their jobs take the GPU one server
    # at a time through server/device_lock.py, so one process's start overlaps another's work and
    # no two servers time on the device at once; never beside the warm server's jobs).
    def process_of(step: tuple) -> str:
        _pair, _cache, rep, prime = step
        return "fresh" if (rep <= args.fresh if not prime else args.fresh >= args.reps) else "warm"

    index = 0
    while index < len(todo):
        prime, process = bool(todo[index][3]), process_of(todo[index])
        phase = []
        while index + len(phase) < len(todo) and bool(todo[index + len(phase)][3]) == prime \
                and process_of(todo[index + len(phase)]) == process:
            phase.append((*todo[index + len(phase)], process))
        if process == "warm" and warm is None:
            from kernelagent.harness import Evaluator

            cache_on.mkdir(exist_ok=True)
            warm = Evaluator(device=args.device, cache_dir=cache_on, concurrency=args.jobs)
        if process == "fresh":
            workers = args.fresh_jobs if not prime else 1  # a fresh prime times its baselines alone
        else:
            workers = min(args.jobs, args.prime_jobs) if prime else args.jobs
        left_out = pipeline(phase, workers, first=index == 0)
        index += len(phase)
        if left_out:
            stopped_early = left_out + len(todo) - index
            break
    if stopped_early:
        notes.append(f"stopped after --max-minutes {args.max_minutes}: {stopped_early} evaluations left; "
                     f"run again with --resume to finish")
        print(f"--max-minutes reached: {stopped_early} evaluations left (rerun with --resume)", flush=True)

    labels = {p.label for p in pairs}
    selected = [r for r in existing if r["label"] in labels and r["cache"] in settings]
    # Each setting that misses its target is re-run once alone (issue 58, scope 3): the same pair,
    # cache setting and process kind, nothing else in flight, within the cap (rep 0, not a prime).
    if args.rerun_misses and not stopped_early:
        by_label = {p.label: p for p in pairs}
        again = {(r["label"], r["cache"], r["process"]) for r in selected if r.get("rerun_alone")}
        steps = [(by_label[s["label"]], s["cache"], 0, False, s["process"]) for s in summarize(selected, args.reps)
                 if s["verdict"] == "MISS" and (s["label"], s["cache"], s["process"]) not in again]
        if any(step[4] == "warm" for step in steps) and warm is None:
            from kernelagent.harness import Evaluator

            cache_on.mkdir(exist_ok=True)
            warm = Evaluator(device=args.device, cache_dir=cache_on, concurrency=args.jobs)
        for step in steps:
            print(f"re-run alone: {step[0].label} (cache {step[1]}, {step[4]}) missed its target", flush=True)
            if pipeline([step], 1, first=False):
                notes.append(f"{step[0].label} (cache {step[1]}, {step[4]}): its re-run alone did not fit "
                             f"--max-minutes")
        selected = [r for r in existing if r["label"] in labels and r["cache"] in settings]
    if warm is not None:
        warm.close()
    summary = summarize(selected, args.reps)
    with out.open("a") as fh:  # every miss's cause, in the JSON too (kind "cause": not an evaluation)
        for s in summary:
            if s.get("cause"):
                fh.write(json.dumps({"kind": "cause", "run_id": run_id, "label": s["label"], "cache": s["cache"],
                                     "process": s["process"], "cause": s["cause"]}) + "\n")
    text = render(summary, selected, header_for(selected, args.reps, notes))
    print()
    print(text, end="", flush=True)
    if args.summary:
        args.summary.write_text(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5, help="counted repetitions per problem and cache setting")
    parser.add_argument("--fresh", type=int, default=1,
                        help="of those, how many run in fresh `kernelagent eval` processes (the rest in one warm server)")
    parser.add_argument("--cache", choices=("on", "off", "both"), default="both",
                        help="the baseline cache: shared by all repetitions (on), fresh per repetition (off)")
    parser.add_argument("--pair", action="append", metavar="PROBLEM:CANDIDATE[@name=value,...]",
                        help="a problem and its candidate (repeatable); replaces the default list")
    parser.add_argument("--pairs", type=Path, metavar="FILE", help="a file of pairs, one a line")
    parser.add_argument("--filter", default="*",
                        help="glob over the pair labels, e.g. 'kb/*'; several globs comma-separated (any matches)")
    parser.add_argument("--device", default="auto", help="passed to `kernelagent eval --device`")
    parser.add_argument("--out", type=Path, default=Path("fidelity.jsonl"), help="JSONL rows, appended as they come")
    parser.add_argument("--summary", type=Path, default=None, help="also write the Markdown summary here")
    parser.add_argument("--resume", action="store_true", help="continue --out, skipping the evaluations it has")
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="cap on the whole invocation: no evaluation starts unless the slowest so far still "
                             "fits, and each one's timeout is cut to the time left (then --resume to go on)")
    parser.add_argument("--eval-timeout", type=float, default=900.0, help="seconds for one evaluation")
    parser.add_argument("--jobs", type=int, default=8,
                        help="warm evaluations in flight at once in the one server (1: one after another)")
    parser.add_argument("--fresh-jobs", type=int, default=3,
                        help="fresh `kernelagent eval` processes started at once (their servers take the GPU one "
                             "at a time: server/device_lock.py; 1: one after another)")
    parser.add_argument("--prime-jobs", type=int, default=4,
                        help="cache primes in flight at once (each compiles and times its baselines, cold): on an "
                             "H100 (2026-11-27) 7 of a wave of 8 ran past their 60 s start limit and were re-run "
                             "alone one by one, 158 s for the wave")
    parser.add_argument("--no-prime", action="store_true",
                        help="do not fill the shared cache first (then repetition 1 with the cache on is a miss)")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="cache directories and resized problems (default: OUT.work next to --out)")
    parser.add_argument("--kernelbench", type=Path, default=KERNELBENCH, help="KernelBench's problem folder")
    parser.add_argument("--no-device-clock", dest="device_clock", action="store_false",
                        help="do not ask for the trace's evidence: no device time per call, host share or "
                             "device-clock speedups (by default warm evaluations ask for the trace's evidence "
                             "alone, no Nsight Compute audit; fresh ones run `eval --kernel-evidence`)")
    parser.add_argument("--no-rerun", dest="rerun_misses", action="store_false",
                        help="do not re-run a setting that misses its target once alone")
    parser.add_argument("--kernel-evidence", action="store_true",
                        help="collect the out-of-process kernel evidence for each win as eval does by default "
                             "(off here: it does not change a time, and costs ~8 s per win on an H200)")
    args = parser.parse_args(argv)
    try:
        return run(args)
    except FidelityError as exc:
        print(f"fidelity.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
