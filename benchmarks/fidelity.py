"""How repeatable is a speedup? The same candidates, evaluated again and again.

The first `--fresh` repetitions of each problem (default 1) run `python -m kernelagent eval
PROBLEM CANDIDATE --json --cache-dir DIR` as a subprocess of their own, so each starts a new
harness server (new CUDA context, new allocator, new Inductor compile unless cached): the spread
a user sees between two `eval`s. The others run in one warm harness server in this process
(`Evaluator`, a fresh candidate and reference process per evaluation, as `bench` and the RL
reward run them), which costs seconds instead of the ~25 s of a fresh process, so a whole table
fits one device call. Each row says which (`process`: fresh or warm), and the table compares the
two (`fresh/warm`). Issue 13, scope 1; issue 25, scope 2.

    python benchmarks/fidelity.py --out fid.jsonl --summary fid.md [--reps 5] [--fresh 1] [--cache on|off|both]
        [--filter 'kb/*'] [--pair PROBLEM:CANDIDATE[@name=value,...]]... [--pairs FILE]
        [--device auto] [--resume] [--max-minutes M] [--eval-timeout S] [--no-prime]

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
A second table gives the GPU's SM clock, its maximum, temperature, power and (NVML) throttle
reasons, read before and after each repetition: from NVML (pynvml, else ctypes on
libnvidia-ml.so.1, which the GPU machines have without pynvml), else from nvidia-smi.

Time cap: `--max-minutes M` bounds the whole invocation (no evaluation starts unless the slowest
one so far still fits; each one's timeout is cut to the time left), and the plan is round robin
(all primes, then the warm repetitions one round at a time, then the fresh-process ones), so a
capped run has the same number of repetitions for every problem. The out-of-process kernel
evidence is off here (`--kernel-evidence` turns it on): it changes no time and cost ~8 s per win
on an H200 (2026-11-26), when a whole default run of 11 pairs ran only its primes and fresh
repetitions in 7.4 minutes. Cost without it: a prime (baselines timed, Inductor compile
included) ~10-20 s, a warm repetition with cached baselines ~3-5 s, a fresh process ~12-15 s.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))  # gpu_clocks beside this script, however it was started
from gpu_clocks import gpu_index, nvml, read_clocks  # noqa: E402
# KernelBench's problems: ../shared/kernelbench beside the checkout, or shared/kernelbench inside it
# (where the GPU machine's copy of the working tree puts it).
KERNELBENCH = next((p for p in (ROOT.parent / "shared" / "kernelbench" / "KernelBench",
                                ROOT / "shared" / "kernelbench" / "KernelBench") if p.is_dir()),
                   ROOT.parent / "shared" / "kernelbench" / "KernelBench")
SMALL_KERNEL_MS = 0.05  # the issue's line between the 1% and the 3% targets


class FidelityError(Exception):
    """Bad input: one line on stderr, exit 2."""


@dataclass
class Pair:
    label: str
    problem: Path
    candidate: Path
    overrides: dict[str, int | float] = field(default_factory=dict)


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
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


def quarter_drift(samples: list[float]) -> float | None:
    """Median of the last quarter of the samples over that of the first quarter."""
    q = len(samples) // 4
    if q < 1:
        return None
    first = statistics.median(samples[:q])
    return statistics.median(samples[-q:]) / first if first > 0 else None


def cv(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else None


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
                  evidence: bool = False) -> tuple[int, dict | None, str, float]:
    """One evaluation in the warm server: the same shape of answer as run_eval. Its own deadline
    is the harness's (stage limits); the cache setting is the config's (`off`: baselines timed
    anew, nothing read from the shared cache)."""
    from kernelagent.harness import EvalConfig

    started = time.perf_counter()
    try:
        result = evaluator.evaluate(problem, candidate.read_text(),
                                    EvalConfig(use_baseline_cache=cache == "on", kernel_evidence=evidence))
    except Exception as exc:  # noqa: BLE001 - a row that says why, as a failed subprocess would
        return -1, None, f"{type(exc).__name__}: {exc}", time.perf_counter() - started
    data = json.loads(json.dumps(result.to_dict(), default=str))
    return (0 if result.passed else 1), data, "", time.perf_counter() - started


def make_row(pair: Pair, cache: str, rep: int, prime: bool, rc: int, data: dict | None, stderr: str,
             wall: float, clocks_before: dict | None, clocks_after: dict | None, run_id: str,
             process: str = "fresh") -> dict:
    row = {"run_id": run_id, "label": pair.label, "problem": str(pair.problem), "candidate": str(pair.candidate),
           "overrides": pair.overrides, "cache": cache, "rep": rep, "prime": prime, "rc": rc, "process": process,
           "wall_s": round(wall, 3), "clocks_before": clocks_before, "clocks_after": clocks_after}
    if data is None:
        row.update(status="no-result", reason=stderr.strip().splitlines()[-1] if stderr.strip() else "no JSON",
                   stderr_tail=stderr)
        return row
    timings = data.get("timings", {})
    cand = timings.get("candidate", {})
    samples = [float(x) for x in cand.get("samples_ms", []) if isinstance(x, (int, float))]
    loop = data.get("timed_loop", {}) or {}
    server, claimed = loop.get("server_ms_per_call"), loop.get("claimed_mean_ms")
    fp = data.get("fingerprint", {}) or {}
    row.update(
        status=data.get("status"), reason=data.get("reason", ""), device=data.get("device"),
        meaningful=cand.get("meaningful", timings.get("eager", {}).get("meaningful")),
        timing_note=cand.get("note", ""),
        baselines_cached=data.get("baselines_cached"),
        candidate_ms=cand.get("median_ms"), eager_ms=timings.get("eager", {}).get("median_ms"),
        compile_ms=timings.get("compile", {}).get("median_ms"),
        speedup_eager=data.get("speedups", {}).get("eager"), speedup_compile=data.get("speedups", {}).get("compile"),
        interval_eager=data.get("speedup_intervals", {}).get("eager"),
        interval_compile=data.get("speedup_intervals", {}).get("compile"),
        n_samples=len(samples), drift_q4_q1=quarter_drift(samples), source=cand.get("source"),
        timed_loop={"server_ms_per_call": server, "claimed_mean_ms": claimed,
                    "ratio": server / claimed if server and claimed else None,
                    "calls": loop.get("calls"), "source": loop.get("source")},
        fingerprint={k: fp.get(k) for k in ("gpu_name", "torch", "torch_cuda", "triton", "python", "device")},
        problem_sha256=data.get("problem_sha256"),
    )
    if data.get("status") != "correct":
        row["stderr_tail"] = stderr
    return row


# -- the summary ---------------------------------------------------------------------------------

def fmt(value, spec: str = ".4g", none: str = "—") -> str:
    return none if value is None else format(value, spec)


def pct(value) -> str:
    return fmt(None if value is None else 100 * value, ".2f") + ("%" if value is not None else "")


def summarize(rows: list[dict], reps: int) -> list[dict]:
    """One entry per (label, cache) over the counted repetitions (not the prime)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        if not row.get("prime"):
            groups.setdefault((row["label"], row["cache"]), []).append(row)
    out = []
    for (label, cache), group in groups.items():
        group.sort(key=lambda r: r["rep"])
        ok = [r for r in group if r.get("status") == "correct" and r.get("candidate_ms")]
        mean = lambda key: statistics.fmean(v) if (v := [r[key] for r in ok if r.get(key) is not None]) else None  # noqa: E731
        cand_ms, su_ind = mean("candidate_ms"), mean("speedup_compile")
        base = "compile" if any(r.get("interval_compile") for r in ok) else "eager"
        su_ref = su_ind if base == "compile" else mean("speedup_eager")
        intervals = [r[f"interval_{base}"] for r in ok if r.get(f"interval_{base}")]
        drifts = [r["drift_q4_q1"] for r in ok if r.get("drift_q4_q1") is not None]
        loops = [r["timed_loop"]["ratio"] for r in ok if (r.get("timed_loop") or {}).get("ratio")]
        meaningful = all(r.get("meaningful") for r in ok) and bool(ok)
        cv_ind = cv([r.get("speedup_compile") for r in ok])
        target = None if cand_ms is None else (0.01 if cand_ms >= SMALL_KERNEL_MS else 0.03)
        if not meaningful or cv_ind is None or target is None:
            verdict = "n/a"
        else:
            verdict = "ok" if cv_ind <= target else "MISS"
        clocks = [c for r in group for c in (r.get("clocks_before"), r.get("clocks_after")) if c and "error" not in c]
        span = lambda key: (min(v), max(v)) if (v := [c[key] for c in clocks if c.get(key) is not None]) else None  # noqa: E731
        out.append({
            "label": label, "cache": cache, "n_ok": len(ok), "n": len(group), "reps": reps, "meaningful": meaningful,
            "candidate_ms": cand_ms, "cv_candidate": cv([r["candidate_ms"] for r in ok]),
            "eager_ms": mean("eager_ms"), "cv_eager": cv([r.get("eager_ms") for r in ok]),
            "compile_ms": mean("compile_ms"), "cv_compile": cv([r.get("compile_ms") for r in ok]),
            "speedup_compile": su_ind, "cv_speedup_compile": cv_ind, "target": target, "verdict": verdict,
            "speedup_eager": mean("speedup_eager"), "cv_speedup_eager": cv([r.get("speedup_eager") for r in ok]),
            "interval_baseline": base,
            "interval": [statistics.median(i[0] for i in intervals), statistics.median(i[1] for i in intervals)]
            if intervals else None,
            "interval_covers": sum(1 for i in intervals if su_ref is not None and i[0] <= su_ref <= i[1]),
            "n_intervals": len(intervals),
            "drift_q4_q1": statistics.median(drifts) if drifts else None,
            "drift_q4_q1_worst": max(drifts, key=lambda d: abs(d - 1)) if drifts else None,
            "rep_last_first": ok[-1]["candidate_ms"] / ok[0]["candidate_ms"] if len(ok) >= 2 else None,
            "sources": sorted({str(r.get("source")) for r in ok}),
            "loop_ratio": statistics.median(loops) if loops else None,
            "cached": sum(1 for r in ok if r.get("baselines_cached")),
            "fresh_over_warm": _fresh_over_warm(ok, "speedup_compile" if base == "compile" else "speedup_eager"),
            "sm_mhz": span("clocks.sm"), "max_sm_mhz": span("clocks.max.sm"),
            "temp_c": span("temperature.gpu"), "power_w": span("power.draw"),
            # NVML's throttle reasons other than "GPU idle" (bit 0) seen around the repetitions
            "throttled": sum(1 for c in clocks if (c.get("throttle_reasons") or 0) & ~1),
            "throttle_read": sum(1 for c in clocks if c.get("throttle_reasons") is not None),
            "failures": [f"rep {r['rep']}: {r.get('status')}: {str(r.get('reason', ''))[:160]}"
                         for r in group if r not in ok],
        })
    return out


def _fresh_over_warm(ok: list[dict], key: str) -> float | None:
    """Mean speedup of the fresh-process repetitions over that of the warm-server ones."""
    fresh = [r[key] for r in ok if r.get("process", "fresh") == "fresh" and r.get(key) is not None]
    warm = [r[key] for r in ok if r.get("process") == "warm" and r.get(key) is not None]
    if not fresh or not warm:
        return None
    return statistics.fmean(fresh) / statistics.fmean(warm)


def render(summary: list[dict], rows: list[dict], header: dict) -> str:
    meaningful = bool(summary) and all(s["meaningful"] for s in summary)
    if not any(s["n_ok"] for s in summary):
        # Nothing counted finished (only primes ran, or every repetition failed): that says
        # nothing about the device, which an H100 run cut after its primes was told it was not.
        warn = ("**No counted repetition finished** (primes only, a time cap, or failures below): "
                "no target is judged.")
    else:
        warn = ("**Timings NOT MEANINGFUL**: " + (header.get("note") or "not measured on a GPU")
                + "; the figures below only show that the script runs, and no target is judged.")
    lines = ["# Fidelity: the same candidates, again and again (fresh processes and one warm server)", ""]
    lines += [f"- device: {header['device']}; torch {header['torch']} (CUDA {header['torch_cuda']}), "
              f"triton {header['triton']}, python {header['python']}",
              f"- driver: {header['driver']}; clocks: {header['clocks']}",
              f"- evaluations: {len(rows)} rows ({sum(1 for r in rows if r.get('prime'))} cache primes, not counted); "
              f"repetitions asked per setting: {header['reps']}",
              "- targets: CV of the speedup over Inductor <= 1% for kernels >= 50 us, <= 3% below", ""]
    if not meaningful:
        lines += [warn, ""]
    cols = ["problem", "cache", "n", "cand ms", "CV cand", "eager ms", "CV eager", "Ind ms", "CV Ind", "x Ind",
            "CV x Ind", "target", "x eager", "CV x eager", "interval", "in int.", "q4/q1 (worst)", "last/first",
            "source", "srv/claim", "cached", "fresh/warm"]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for s in summary:
        target = "—" if s["target"] is None else f"<= {s['target'] * 100:.0f}%: {s['verdict']}"
        interval = "—" if s["interval"] is None else (
            f"[{s['interval'][0]:.4g}, {s['interval'][1]:.4g}]" + (" (eager)" if s["interval_baseline"] == "eager" else ""))
        cells = [s["label"], s["cache"], f"{s['n_ok']}/{s['n']}", fmt(s["candidate_ms"]), pct(s["cv_candidate"]),
                 fmt(s["eager_ms"]), pct(s["cv_eager"]), fmt(s["compile_ms"]), pct(s["cv_compile"]),
                 fmt(s["speedup_compile"], ".4g"), pct(s["cv_speedup_compile"]), target,
                 fmt(s["speedup_eager"], ".4g"), pct(s["cv_speedup_eager"]), interval,
                 f"{s['interval_covers']}/{s['n_intervals']}",
                 f"{fmt(s['drift_q4_q1'], '.3f')} ({fmt(s['drift_q4_q1_worst'], '.3f')})",
                 fmt(s["rep_last_first"], ".3f"), ",".join(s["sources"]) or "—", fmt(s["loop_ratio"], ".3f"),
                 f"{s['cached']}/{s['n_ok']}", fmt(s.get("fresh_over_warm"), ".3f")]
        lines.append("| " + " | ".join(cells) + " |")
    if not meaningful:
        lines += ["", warn]
    lines += ["", f"## GPU clocks ({header['clocks']})", ""]
    if header["clocks"].startswith("nvidia-smi not found"):
        lines.append("nvidia-smi not found on this machine: no clocks, temperatures or power were read.")
    else:
        lines += ["| problem | cache | SM MHz (min-max) | max SM MHz | temp C | power W | throttled readings |",
                  "|---|---|---|---|---|---|---|"]
        rng = lambda v, spec=".0f": "—" if v is None else f"{v[0]:{spec}}-{v[1]:{spec}}"  # noqa: E731
        for s in summary:
            throttled = f"{s.get('throttled', 0)}/{s['throttle_read']}" if s.get("throttle_read") else "—"
            lines.append(f"| {s['label']} | {s['cache']} | {rng(s['sm_mhz'])} | {rng(s['max_sm_mhz'])} | "
                         f"{rng(s['temp_c'])} | {rng(s['power_w'], '.1f')} | {throttled} |")
    failures = [f"- {s['label']} (cache {s['cache']}) {f}" for s in summary for f in s["failures"]]
    if failures:
        lines += ["", "## Repetitions without a correct timed result", "", *failures]
    judged = [s for s in summary if s["verdict"] in ("ok", "MISS")]
    if judged:
        met = sum(1 for s in judged if s["verdict"] == "ok")
        lines += ["", f"Target met for {met} of {len(judged)} problem/cache settings."]
    if header.get("notes"):
        lines += ["", "## Notes", "", *[f"- {n}" for n in header["notes"]]]
    return "\n".join(lines) + "\n"


def header_for(rows: list[dict], reps: int, notes: list[str]) -> dict:
    fp = next((r["fingerprint"] for r in rows if r.get("fingerprint")), {})
    note = next((r["timing_note"] for r in rows if r.get("timing_note")), "")
    driver, clocks = "—", "nvidia-smi not found: no GPU clocks read"
    sources = sorted({c["source"] for r in rows for c in (r.get("clocks_before"), r.get("clocks_after"))
                      if isinstance(c, dict) and c.get("source")})
    if sources:
        clocks = f"{', '.join(sources)}, before and after each repetition"
    if shutil.which("nvidia-smi"):
        clocks = clocks if sources else "nvidia-smi, before and after each repetition"
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            driver = "nvidia-smi failed"
    return {"device": fp.get("gpu_name") or fp.get("device") or "unknown", "torch": fp.get("torch"),
            "torch_cuda": fp.get("torch_cuda"), "triton": fp.get("triton"), "python": fp.get("python"),
            "driver": driver, "clocks": clocks, "reps": reps, "note": note, "notes": notes}


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
    existing = load_rows(out) if out.is_file() else []
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
    for index, (pair, cache, rep, prime) in enumerate(todo):
        eval_timeout = args.eval_timeout
        if args.max_minutes is not None:
            left = args.max_minutes * 60 - (time.perf_counter() - started)
            kind = "off" if prime else cache
            expected = slowest.get(kind, max(slowest.values(), default=0.0))
            if left <= 0 or (index > 0 and expected > left):
                stopped_early = len(todo) - index
                break
            eval_timeout = min(eval_timeout, max(left, 1.0))
        problem = problem_file(pair, work)
        if cache == "on":
            cache_dir = cache_on
            cache_dir.mkdir(exist_ok=True)
        else:  # a fresh, empty directory: nothing cached, the baselines are timed again
            cache_dir = Path(tempfile.mkdtemp(prefix="cache-off-", dir=work))
        # the prime warms the server too, unless every repetition is to be fresh
        process = "fresh" if (rep <= args.fresh if not prime else args.fresh >= args.reps) else "warm"
        try:
            before = read_clocks(gpu)
            if process == "fresh":
                rc, data, stderr, wall = run_eval(problem, pair.candidate, cache_dir, args.device, eval_timeout,
                                                  args.kernel_evidence)
            else:
                if warm is None:
                    from kernelagent.harness import Evaluator

                    cache_on.mkdir(exist_ok=True)
                    warm = Evaluator(device=args.device, cache_dir=cache_on)
                rc, data, stderr, wall = run_eval_warm(warm, problem, pair.candidate, cache, args.kernel_evidence)
            after = read_clocks(gpu)
            kind = "off" if prime else cache
            slowest[kind] = max(slowest.get(kind, 0.0), wall)
        finally:
            if cache == "off":
                shutil.rmtree(cache_dir, ignore_errors=True)
        row = make_row(pair, cache, rep, prime, rc, data, stderr, wall, before, after, run_id, process)
        with out.open("a") as fh:  # after every evaluation: a run cut short keeps what it measured
            fh.write(json.dumps(row) + "\n")
        existing.append(row)
        clock = "—" if not before or before.get("clocks.sm") is None else f"{before['clocks.sm']:.0f}"
        print(f"{pair.label[:44]:44} {cache:5} {'prime' if prime else rep:>5} {str(row['status'])[:10]:10} "
              f"{fmt(row.get('candidate_ms'), '10.4g')} {fmt(row.get('speedup_compile'), '7.4g')} "
              f"{fmt(row.get('speedup_eager'), '8.4g')} {fmt(row.get('drift_q4_q1'), '6.3f')} {wall:7.1f} {clock:>9}",
              flush=True)
    if stopped_early:
        notes.append(f"stopped after --max-minutes {args.max_minutes}: {stopped_early} evaluations left; "
                     f"run again with --resume to finish")
        print(f"--max-minutes reached: {stopped_early} evaluations left (rerun with --resume)", flush=True)

    if warm is not None:
        warm.close()
    labels = {p.label for p in pairs}
    selected = [r for r in existing if r["label"] in labels and r["cache"] in settings]
    summary = summarize(selected, args.reps)
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
    parser.add_argument("--no-prime", action="store_true",
                        help="do not fill the shared cache first (then repetition 1 with the cache on is a miss)")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="cache directories and resized problems (default: OUT.work next to --out)")
    parser.add_argument("--kernelbench", type=Path, default=KERNELBENCH, help="KernelBench's problem folder")
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
