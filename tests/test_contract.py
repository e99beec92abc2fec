"""One typed evaluation contract (issue 57, step 6), read from the source:

- every class of the package that defines `evaluate` implements `EvaluatorProtocol`
  (kernelagent/harness/contract.py) with its exact signature, or is one of the few other seams
  listed below, each with its own Protocol; a new `evaluate` that is in neither table, or whose
  signature differs from its Protocol's, fails here;
- the MCP server and the RL package use other modules' public names only (no `_private` import,
  no `obj._private` reached into);
- the CLI passes its settings by keyword (no EvalConfig built from positions, no long
  positional call from a command to its body).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from kernelagent.harness import EvaluatorProtocol, FingerprintedEvaluator
from tests.conftest import REPO

PACKAGE = REPO / "kernelagent"

# Every EvaluatorProtocol implementation: evaluate(problem, candidate_source, config=None, *, cancel=None).
IMPLEMENTERS = [
    "kernelagent.harness.caller.evaluator.Evaluator",  # the harness itself (cancel: kills this job)
    "kernelagent.harness.caller.pool.EvaluatorPool",  # the least-loaded of several Evaluators
    "kernelagent.ci.verify.CachedEvaluator",  # ci verify/regenerate: through the store
    "kernelagent.mcpserver.calls.CallEvaluator",  # MCP: cancelled with the tool call
    "kernelagent.rl.ray_backend.RayBackend",  # RL over Ray actors (cancel not honoured: documented)
    "kernelagent.bench.dispatch.ProblemEvaluator",  # bench: the agent's evaluator, through the store
]

# The other seams that define `evaluate`, with the Protocol each implements (why each is not an
# EvaluatorProtocol is in the Protocol's docstring).
OTHER_SEAMS = {
    "kernelagent.agent.tools.HarnessTools": "kernelagent.agent.loop.ToolExecutor",  # the model's code -> Observation
    "kernelagent.cluster.actors.EvalActor": "kernelagent.cluster.actors.RemoteEvaluator",  # plain data over Ray
    "kernelagent.bench.dispatch.Dispatcher": "kernelagent.bench.dispatch.StoreDispatch",  # an attempt, recorded
    "kernelagent.bench.ray_pool.RayWorker": "kernelagent.bench.dispatch.DispatchWorker",  # a dispatcher's worker
}

PROTOCOLS = {"kernelagent.harness.contract.EvaluatorProtocol", *OTHER_SEAMS.values()}  # define evaluate themselves


def _module_name(path: Path, base: Path) -> str:
    parts = path.relative_to(base).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def classes_defining_evaluate(root: Path = PACKAGE) -> tuple[set[str], list[str]]:
    """(qualified names of module-level classes that define evaluate, nested ones: where)."""
    found, nested = set(), []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = set()
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == "evaluate" for f in node.body):
                found.add(f"{_module_name(path, root.parent)}.{node.name}")
                top.add(id(node))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and id(node) not in top and any(
                    isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == "evaluate" for f in node.body):
                nested.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name}")
    return found, nested


def load(qualified: str) -> type:
    module, _, name = qualified.rpartition(".")
    return getattr(importlib.import_module(module), name)


# Ray adds this keyword to an actor class's methods' signatures once any actor class is made in the
# process (ray/util/tracing/tracing_helper.py `_inject_tracing_into_class`, on the unwrapped
# method): which test ran first in the worker decided whether EvalActor's evaluate showed it.
RAY_INJECTED = {"_ray_trace_ctx"}


def shape(function) -> list[tuple[str, str, object]]:
    """The parameters after self: name, kind and default (annotations are strings here)."""
    params = list(inspect.signature(function).parameters.values())[1:]
    return [(p.name, p.kind.name, p.default) for p in params if p.name not in RAY_INJECTED]


def test_every_class_defining_evaluate_is_in_a_table():
    """A new evaluate() must implement EvaluatorProtocol (IMPLEMENTERS) or name its own seam."""
    found, nested = classes_defining_evaluate()
    assert not nested, f"define these at module level, in a table here: {nested}"
    known = set(IMPLEMENTERS) | set(OTHER_SEAMS) | PROTOCOLS
    assert found - known == set(), "classes defining evaluate in no table of tests/test_contract.py"
    assert known - found == set(), "names in the tables that no longer define evaluate"


@pytest.mark.parametrize("qualified", IMPLEMENTERS)
def test_implementer_has_the_protocols_evaluate(qualified):
    cls = load(qualified)
    assert issubclass(cls, EvaluatorProtocol)
    assert shape(cls.evaluate) == shape(EvaluatorProtocol.evaluate), qualified
    assert shape(EvaluatorProtocol.evaluate) == [
        ("problem", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
        ("candidate_source", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
        ("config", "POSITIONAL_OR_KEYWORD", None), ("cancel", "KEYWORD_ONLY", None)]


@pytest.mark.parametrize("qualified,protocol", sorted(OTHER_SEAMS.items()))
def test_other_seam_has_its_own_protocols_evaluate(qualified, protocol):
    cls, proto = load(qualified), load(protocol)
    assert getattr(proto, "_is_protocol", False) and getattr(proto, "_is_runtime_protocol", False), protocol
    assert issubclass(cls, proto)
    assert shape(cls.evaluate) == shape(proto.evaluate), qualified
    assert shape(proto.evaluate) != shape(EvaluatorProtocol.evaluate)  # else it is no other seam


def test_the_evaluators_with_a_fingerprint_satisfy_the_fingerprinted_protocol():
    """What the agent, the RL environments and optimize take (FingerprintedEvaluator)."""
    for qualified in ["kernelagent.harness.caller.evaluator.Evaluator", "kernelagent.harness.caller.pool.EvaluatorPool",
                      "kernelagent.ci.verify.CachedEvaluator", "kernelagent.rl.ray_backend.RayBackend",
                      "kernelagent.bench.dispatch.ProblemEvaluator"]:
        assert issubclass(load(qualified), FingerprintedEvaluator), qualified


@pytest.mark.parametrize("source,why", [
    ("class Fake:\n    def evaluate(self, problem, source, config=None):\n        pass\n", "renamed, no cancel"),
    ("class Fake:\n    def evaluate(self, problem, candidate_source, config):\n        pass\n", "config required"),
    ("class Fake:\n    def evaluate(self, problem, candidate_source, config=None, cancel=None):\n        pass\n",
     "cancel positional"),
])
def test_a_new_evaluate_with_another_signature_is_caught(tmp_path, source, why):
    """The checks above bite: a class like these, added to the package, is found and differs."""
    (tmp_path / "kernelagent").mkdir()
    (tmp_path / "kernelagent" / "fake.py").write_text(source)
    found, _ = classes_defining_evaluate(tmp_path / "kernelagent")
    assert found == {"kernelagent.fake.Fake"}
    namespace: dict = {}
    exec(compile(source, "fake.py", "exec"), namespace)  # noqa: S102 - our own literal above
    assert shape(namespace["Fake"].evaluate) != shape(EvaluatorProtocol.evaluate), why


# -- public names only, from the MCP server and the RL package ---------------------------------
def private_reaches(path: Path) -> list[str]:
    """`from kernelagent.x import _y`, `import kernelagent.x._y`, and `obj._y` on anything but self,
    cls or a module this file imported from outside kernelagent (the standard library's own
    `sys._getframe` is not ours to judge)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    outside = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
               for a in n.names if not a.name.startswith("kernelagent")}
    private = lambda name: name.startswith("_") and not name.startswith("__")  # noqa: E731
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kernelagent"):
            found += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names if private(a.name)]
            if any(private(part) for part in node.module.split(".")):
                found.append(f"{node.lineno}: from {node.module}")
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names
                      if a.name.startswith("kernelagent") and any(private(p) for p in a.name.split("."))]
        elif isinstance(node, ast.Attribute) and private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and (owner.id in ("self", "cls") or owner.id in outside):
                continue
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("room", ["mcpserver", "rl"])
def test_no_private_name_of_another_module_is_used(room):
    used = {str(p.relative_to(REPO)): hits for p in sorted((PACKAGE / room).rglob("*.py"))
            if (hits := private_reaches(p))}
    assert used == {}


@pytest.mark.parametrize("source,hit", [
    ("from kernelagent.agent.tools import _DESCRIBE_INPUTS\n", "_DESCRIBE_INPUTS"),
    ("tools._evaluate('evaluate', code, {})\n", "tools._evaluate"),
    ("backend = self.reward._backend\n", "self.reward._backend"),
    ("import sys\nsys._getframe()\nself._x = 1\n", None),
])
def test_the_private_name_check_bites(tmp_path, source, hit):
    path = tmp_path / "m.py"
    path.write_text(source)
    found = private_reaches(path)
    assert (found == []) if hit is None else any(hit in f for f in found), found


# -- the CLI: settings by keyword -----------------------------------------------------------
CLI = sorted((PACKAGE / "cli").glob("*.py"))
CONFIG_BUILDERS = {"EvalConfig", "e2e_config"}


def _callee(call: ast.Call) -> str:
    return call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")


def test_the_cli_builds_eval_config_by_keyword_only():
    positional = [f"{p.name}:{n.lineno}" for p in CLI for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                  if isinstance(n, ast.Call) and _callee(n) in CONFIG_BUILDERS and n.args]
    assert positional == []


def test_no_cli_call_passes_more_than_four_positional_arguments():
    """A command hands its options to its body by name (eval's was a 21-argument positional call)."""
    long = [f"{p.name}:{n.lineno} {_callee(n)}({len(n.args)} positional)" for p in CLI
            for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))) if isinstance(n, ast.Call) and len(n.args) > 4]
    assert long == []


def test_eval_commands_body_takes_keywords_only():
    tree = ast.parse((PACKAGE / "cli" / "eval_cmd.py").read_text(encoding="utf-8"))
    bodies = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("_run", "_report")}
    assert set(bodies) == {"_run", "_report"}
    assert {name: [a.arg for a in fn.args.posonlyargs + fn.args.args] for name, fn in bodies.items()} == \
        {"_run": [], "_report": []}
