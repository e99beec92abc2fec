"""The job's typed record (server/job_record.py, issue 57): the server's stages write its fields,
never an untyped result dict, and its wire dict is what the caller builds its EvalResult from."""

from __future__ import annotations

import ast
import copy
import dataclasses
import re
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints, is_typeddict

import pytest

from kernelagent.harness import EvalConfig
from kernelagent.harness import verdict as fold
from kernelagent.harness.caller.results import merge
from kernelagent.harness.result import EvalResult, Status
from kernelagent.harness.server.job import Job
from kernelagent.harness.server import record_types
from kernelagent.harness.server.job_record import OPTIONAL, JobRecord
from tests.conftest import CANDIDATES

SERVER = Path(__file__).resolve().parents[1] / "kernelagent" / "harness" / "server"
# a job's (or a stage's job's) old result dict: job.result, self.result, self.job.result
OLD_DICT = re.compile(r"\b(?:job|self)\.result\b")

# The keys of the dict a fresh job's result held before anything ran (before the record).
ALWAYS = {"status", "reason", "stage", "correct", "compiled", "trials", "timings", "flags", "stage_seconds",
          "kernels", "memory"}
# Keys the caller takes out of the wire dict itself (caller/evaluator.py pops "evidence",
# caller/results.merge pops "baselines"); every other field is an EvalResult field of that name.
CALLER_OWN = {"evidence", "baselines"}


def test_no_server_module_writes_or_reads_the_old_result_dict():
    found = [f"{path.name}:{n}: {line.strip()}" for path in sorted(SERVER.glob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if OLD_DICT.search(line)]
    assert not found, "the job's result is its record, job.facts (server/job_record.py):\n" + "\n".join(found)


@pytest.mark.parametrize("line, old", [("job.result['flags'] = []", True), ('x = self.result.get("log")', True),
                                       ("self.job.result['memory'].update(a=1)", True),
                                       ("job.facts.flags.append(f)", False), ("f.result()", False)])
def test_the_scan_sees_the_old_dict(line, old):
    assert bool(OLD_DICT.search(line)) == old


def test_a_fresh_jobs_record_sends_what_its_result_dict_held(tmp_path):
    job = Job({"job": "j", "config": EvalConfig().to_dict(), "problem_source": "", "candidate_source": ""},
              tmp_path, {"free_bytes": 1 << 30}, {})
    assert not hasattr(job, "result")
    assert job.facts.to_wire() == {**fold.fields(fold.fold([])), "compiled": False, "trials": [], "timings": {},
                                   "flags": [], "stage_seconds": {}, "kernels": [], "memory": {}}
    assert set(JobRecord().to_wire()) == ALWAYS
    # the fold writes the record's verdict (Job.record), and a set optional field goes on the wire
    job.record(fold.Failed(Status.TIMEOUT, "stage 'load' ran past its limit", "load"))
    job.facts.device = "cpu"
    wire = job.facts.to_wire()
    assert (wire["status"], wire["stage"], wire["correct"], wire["device"]) == (Status.TIMEOUT, "load", False, "cpu")
    assert set(wire) == ALWAYS | {"device"}


def test_every_field_is_one_the_caller_reads():
    names = {f.name for f in dataclasses.fields(JobRecord)}
    evalresult = {f.name for f in dataclasses.fields(EvalResult)}
    assert set(OPTIONAL) <= names
    assert names - CALLER_OWN <= evalresult, sorted(names - CALLER_OWN - evalresult)


class _Cache:
    def __init__(self) -> None:
        self.put_calls: list[tuple[str, dict]] = []

    def put(self, key: str, value: dict) -> None:
        self.put_calls.append((key, value))


def _timing(ms: float) -> dict:
    return {"median_ms": ms, "q1_ms": ms, "q3_ms": ms, "min_ms": ms, "reps": 10, "meaningful": False}


def test_a_full_record_builds_the_callers_result():
    """Every field set as the stages set them; the caller's merge (caller/results.py) over its wire
    dict gives an EvalResult with each of them."""
    record = JobRecord(
        compiled=True, trials=[{"name": "trial 0", "seed": 7, "passed": True, "max_abs_err": 0.0, "max_rel_err": 0.0,
                                "rel_l2_err": 0.0, "precision": "float64", "message": ""}],
        timings={"candidate": _timing(2.0)}, flags=[{"kind": "x", "message": "m", "severity": "info"}],
        stage_seconds={"load": 1.5}, kernels=[{"name": "k", "total_ns": 10}], memory={"io_bytes": 64},
        log="tail", derived={"note": ""}, timed_loop={"calls": 40}, evidence={"source": "trace"},
        baselines={"timings": {"eager": _timing(4.0)}, "errors": {}}, workload={"input_bytes": 32},
        trace={"bytes": 22, "overflow": False, "ended": True}, seeds={"base": 3}, input_set="smoke", device="cpu",
        concurrency={"shared_device": False})
    fold.apply_to(record, [fold.Concluded(Status.CORRECT, "", None)])
    wire = record.to_wire()
    assert set(wire) == {f.name for f in dataclasses.fields(JobRecord)}
    raw = dict(wire)
    assert raw.pop("evidence") == {"source": "trace"}  # the caller's evaluator takes it out (caller/evaluator.py)
    cache = _Cache()
    result = merge(EvalResult(status=Status.HARNESS_ERROR), raw, None, "key", EvalConfig(), cache)
    assert (result.status, result.correct, result.compiled) == (Status.CORRECT, True, True)
    assert result.trials[0].seed == 7 and result.trials[0].precision == "float64"
    assert result.timings["candidate"].median_ms == 2.0 and result.timings["eager"].median_ms == 4.0
    assert result.speedups["eager"] == pytest.approx(2.0)
    assert [(f.kind, f.severity) for f in result.flags] == [("x", "info")]
    for name in ("stage_seconds", "kernels", "memory", "log", "derived", "timed_loop", "workload", "trace", "seeds",
                 "input_set", "device", "concurrency"):
        assert getattr(result, name) == wire[name], name
    assert cache.put_calls and cache.put_calls[0][1]["timings"] == {"eager": _timing(4.0)}


# --- the nested fields' shapes (server/record_types.py): every key a stage writes is declared ---

HINTS = get_type_hints(JobRecord)


def _typed_dict(hint: Any) -> Any:
    """The TypedDict `hint` names (through `X | None`), or None."""
    if is_typeddict(hint):
        return hint
    if get_origin(hint) in (Union, types.UnionType):
        found = [a for a in get_args(hint) if is_typeddict(a)]
        return found[0] if len(found) == 1 else None
    return None


def undeclared(value: Any, hint: Any, where: str) -> list[str]:
    """The keys under `value` (a wire dict's field) that its declared type does not name: through
    TypedDicts, `X | None`, lists and dicts' values, recursively."""
    if (shape := _typed_dict(hint)) is not None:
        if not isinstance(value, dict):
            return []
        keys = get_type_hints(shape)
        return [found for key, item in value.items()
                for found in ([f"{where}.{key}"] if key not in keys else undeclared(item, keys[key], f"{where}.{key}"))]
    args = get_args(hint)
    if get_origin(hint) is list and isinstance(value, list):
        return [found for i, item in enumerate(value) for found in undeclared(item, args[0], f"{where}[{i}]")]
    if get_origin(hint) is dict and isinstance(value, dict):
        return [found for key, item in value.items() for found in undeclared(item, args[1], f"{where}[{key!r}]")]
    return []


@pytest.mark.parametrize("wire, found", [
    ({"timed_loop": {"calls": 21, "warmup": 3}}, ["timed_loop.warmup"]),
    ({"timed_loop": {"empty_call_ms": {"event": 0.0, "device": 1.0}}}, ["timed_loop.empty_call_ms.device"]),
    ({"timed_loop": {"empty_call_ms": None}, "trace": None}, []),
    ({"timings": {"candidate": {"median_ms": 1.0, "p90_ms": 2.0}}}, ["timings['candidate'].p90_ms"]),
    ({"baselines": {"timings": {"eager": {"reps": 3, "mean_ms": 1.0}}, "errors": {"x": "y"}}},
     ["baselines.timings['eager'].mean_ms"]),
    ({"derived": {"sets": [{"name": "a", "kind": "extra:0", "dims": ""}], "skipped": [{"name": "b", "why": ""}]}},
     ["derived.sets[0].dims", "derived.skipped[0].why"]),
    ({"concurrency": {"held_s": 1.0, "evidence_slot": {"wait_s": 0.0, "ncu_s": 1.0}}},
     ["concurrency.evidence_slot.ncu_s"]),
    ({"concurrency": {"at_limit": {"candidate": [], "gdb": ""}}, "memory": {"peak_bytes": 1}},
     ["concurrency.at_limit.gdb", "memory.peak_bytes"]),
    ({"evidence": {"anything": {"at": "all"}}, "seeds": {"base": 1, "salt": 2}}, ["seeds.salt"]),
])
def test_the_key_check_sees_an_undeclared_key_at_any_depth(wire, found):
    assert [k for name, value in wire.items() for k in undeclared(value, HINTS[name], name)] == found


RELU = CANDIDATES / "relu_problem.py"


def test_a_cpu_evaluation_sends_only_declared_keys(evaluator, fast_config, tmp_path, monkeypatch):
    """A whole CPU evaluation (derived smoke sizes, derived check sets, the timed loop with its
    calibration, fresh baselines): every key of every nested dict of the wire dict the server sent
    is one its TypedDict (server/record_types.py) declares."""
    # relu_problem.py at KernelBench's sizes without its smoke and extra inputs: the CPU derives both
    source = RELU.read_text().split("def get_smoke_inputs")[0]
    problem = tmp_path / "big_relu.py"
    problem.write_text(source.replace("batch_size = 64", "batch_size = 4096").replace("dim = 65536", "dim = 393216"))
    wires: list[dict[str, Any]] = []
    merge_ = evaluator._merge

    def keep(base: EvalResult, raw: dict[str, Any], *args: Any, **kwargs: Any) -> EvalResult:
        wires.append(copy.deepcopy(raw))
        return merge_(base, raw, *args, **kwargs)

    monkeypatch.setattr(evaluator, "_merge", keep)
    result = evaluator.evaluate(problem, (CANDIDATES / "relu_good.py").read_text(),
                                dataclasses.replace(fast_config, use_baseline_cache=False))
    assert result.status == Status.CORRECT, result.feedback()
    (wire,) = wires
    # the stages wrote what this test is about
    assert {"smoke", "main", "sets", "skipped"} <= set(wire["derived"]) and wire["derived"]["sets"]
    assert {"timings", "errors", "skipped"} <= set(wire["baselines"]) and wire["baselines"]["timings"]
    assert {"empty_call_ms", "server_ms_per_call"} <= set(wire["timed_loop"]) and "candidate" in wire["timings"]
    assert {"held", "slot_loop_s", "span"} <= set(wire["concurrency"]) and wire["workload"] and wire["seeds"]
    found = [k for name, value in wire.items() if name in HINTS for k in undeclared(value, HINTS[name], name)]
    assert not found, f"keys the record's TypedDicts (server/record_types.py) do not declare: {found}"


# Dicts the stages write that are not the record's fields: the job's own `concurrency` (sent as
# the record's, gate.describe) and a slot hold's `stats` (gate.Gate.hold: the job's concurrency, or
# its profile_slot / evidence_slot).
NAMED = {"concurrency": record_types.ConcurrencyRecord, "stats": record_types.SlotRecord}


def _hint_of(node: ast.AST) -> Any:
    """The declared type of the dict `node` names in a stage's code: `<x>.facts.<field>`,
    `<x>.concurrency`, `stats`, and a declared key of one of those (`[k]`, `.setdefault(k, ...)`)."""
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Attribute) and node.value.attr == "facts":
            return HINTS.get(node.attr)
        return NAMED.get(node.attr)
    if isinstance(node, ast.Name):
        return NAMED.get(node.id) or getattr(record_types, node.id, None)
    key = node.slice if isinstance(node, ast.Subscript) else \
        node.args[0] if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
        and node.func.attr == "setdefault" and node.args else None
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        owner = _typed_dict(_hint_of(node.value if isinstance(node, ast.Subscript) else node.func.value))
        return get_type_hints(owner).get(key.value) if owner is not None else None
    return None


def _literal_keys(node: ast.AST, hint: Any) -> list[Any]:
    """A dict literal's constant keys that its declared type does not name, nested literals' too."""
    shape = _typed_dict(hint)
    if shape is None or not isinstance(node, ast.Dict):
        return []
    keys = get_type_hints(shape)
    out = []
    for key, value in zip(node.keys, node.values):
        if isinstance(key, ast.Constant):
            out += [key.value] if key.value not in keys else _literal_keys(value, keys[key.value])
    return out


def written_keys(tree: ast.AST) -> list[tuple[int, Any]]:
    """(line, key) of each key this code writes into a record dict that its TypedDict does not declare:
    `d[k] = v`, `d.update(k=v)`, `d.setdefault(k, v)`, `add_seconds(d, k, s)`, `d = {k: v}` (also
    annotated), `d.append({k: v})` for a list of TypedDicts, `return {k: v}` from a function that
    returns one of them."""
    bad: list[tuple[int, Any]] = []

    def check(hint: Any, keys: list[Any], line: int) -> None:
        if (shape := _typed_dict(hint)) is not None:
            bad.extend((line, k) for k in keys if k not in get_type_hints(shape))

    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and isinstance(node.slice, ast.Constant):
            check(_hint_of(node.value), [node.slice.value], node.lineno)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.annotation]
            for target in targets:
                bad += [(node.lineno, k) for k in _literal_keys(node.value, _hint_of(target))]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            hint, name = _hint_of(node.func.value), node.func.attr
            if name == "update":
                check(hint, [k.arg for k in node.keywords if k.arg], node.lineno)
                for arg in node.args:
                    bad += [(node.lineno, k) for k in _literal_keys(arg, hint)]
            elif name == "setdefault" and node.args and isinstance(node.args[0], ast.Constant):
                check(hint, [node.args[0].value], node.lineno)
            elif name == "append" and get_origin(hint) is list and node.args:
                bad += [(node.lineno, k) for k in _literal_keys(node.args[0], get_args(hint)[0])]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            returns = [n for n in ast.walk(node.returns) if isinstance(n, ast.Name)]  # `X | None`: X
            hint = next((h for n in returns if _typed_dict(h := _hint_of(n)) is not None), None)
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and ret.value is not None:
                    bad += [(ret.lineno, k) for k in _literal_keys(ret.value, hint)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "add_seconds" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            check(_hint_of(node.args[0]), [node.args[1].value], node.lineno)
    return bad


def test_the_stages_write_only_declared_keys():
    """The keys a CPU evaluation never writes (the GPU's slots, the device lock, a stage past its
    limit) are checked in the code: each key a server module writes into a record dict is declared."""
    found = [f"{path.name}:{line}: {key!r}" for path in sorted(SERVER.glob("*.py"))
             for line, key in written_keys(ast.parse(path.read_text()))]
    assert not found, "keys the record's TypedDicts (server/record_types.py) do not declare:\n" + "\n".join(found)


@pytest.mark.parametrize("code, keys", [
    ("job.facts.timed_loop['calls'] = 1\njob.facts.timed_loop['loops'] = 1", ["loops"]),
    ("self.job.facts.memory.update(io_bytes=1, heap_bytes=2)", ["heap_bytes"]),
    ("job.facts.baselines = {'errors': {}, 'warnings': {}}", ["warnings"]),
    ("job.facts.derived.setdefault('skipped', []).append({'name': 'a', 'why': 'b'})", ["why"]),
    ("self.concurrency['at_limit'] = {'candidate': [], 'gdb': []}\nself.concurrency['at_limit']['core'] = ''",
     ["gdb", "core"]),
    ("add_seconds(job.concurrency, 'slot_loop_s', 1)\nadd_seconds(stats, 'slot_nap_s', 1)", ["slot_nap_s"]),
    ("job.concurrency.setdefault('evidence_slot', {})['ncu_s'] = 1\nstats.setdefault('held', [])", ["ncu_s"]),
    ("timing: TimingRecord = {**t, 'samples_ms': [], 'p90_ms': 1}", ["p90_ms"]),
    ("def acquire(self) -> DeviceLockInfo:\n    return {'device_lock': 'held', 'lock_wait_s': 0.0}", ["lock_wait_s"]),
    ("def f() -> EmptyCallClaim | None:\n    if x:\n        return None\n    return {'event': 1, 'device': 2}",
     ["device"]),
    ("job.facts.evidence['anything'] = 1\njob.facts.timings['candidate'] = {}", []),
])
def test_the_code_scan_sees_each_kind_of_write(code, keys):
    assert [k for _, k in written_keys(ast.parse(code))] == keys
