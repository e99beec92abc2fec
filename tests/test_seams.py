"""The server's stage modules take the job through Protocols (server/seams.py, issue 57), not
`Any` and not server/job.py (which imports them). A Protocol of attributes cannot be checked with
isinstance, so: every member each Protocol declares is on a built Job, or declared on its class
(the few that the start's stage, server/start.py, sets), with a matching kind (a method where the Protocol has a method)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from kernelagent.harness import EvalConfig
from kernelagent.harness.server import seams
from kernelagent.harness.server.gate import Freezable
from kernelagent.harness.server.job import Job


def members(protocol: type) -> tuple[set[str], set[str]]:
    """(attributes, methods) a Protocol declares, its bases' included."""
    attributes, methods = set(), set()
    for klass in protocol.__mro__:
        if klass is object or not getattr(klass, "_is_protocol", False) or klass.__name__ == "Protocol":
            continue
        attributes |= set(klass.__dict__.get("__annotations__", {}))
        methods |= {name for name, value in klass.__dict__.items()
                    if inspect.isfunction(value) and not name.startswith("_")}
    return attributes, methods


def declared(klass: type) -> set[str]:
    return {name for k in klass.__mro__ for name in k.__dict__.get("__annotations__", {})}


@pytest.fixture
def job(tmp_path: Path) -> Job:
    return Job({"job": "j", "config": EvalConfig().to_dict(), "problem_source": "", "candidate_source": ""},
               tmp_path, {"free_bytes": 1 << 30}, {})


@pytest.mark.parametrize("protocol", [seams.TraceJob, seams.EvidenceJob, Freezable, seams.StartJob, seams.ChannelJob,
                                      seams.LoadJob, seams.CheckJob, seams.CalibrationJob, seams.TimedJob,
                                      seams.BaselineJob, seams.MemoryJob, seams.FailureJob])
def test_the_job_has_every_member_its_stages_protocol_names(job, protocol):
    attributes, methods = members(protocol)
    assert attributes
    missing = sorted(name for name in attributes if not hasattr(job, name) and name not in declared(Job))
    assert not missing, f"Job lacks {missing} of {protocol.__name__}"
    not_methods = sorted(name for name in methods if not callable(getattr(job, name, None)))
    assert not not_methods, f"Job has no method {not_methods} of {protocol.__name__}"


def test_evidence_and_the_trace_stage_take_the_protocol_not_the_job():
    from kernelagent.harness.server import evidence, trace_stage

    for module, name in ((evidence, "EvidenceJob"), (trace_stage, "TraceJob")):
        taking = [f for f in vars(module).values() if inspect.isfunction(f) and f.__module__ == module.__name__
                  and "job" in inspect.signature(f).parameters]
        assert taking
        assert {inspect.signature(f).parameters["job"].annotation for f in taking} == {name}


STAGES = [("start", "start", "Start", "StartJob"), ("channels", "channels", "Channels", "ChannelJob"), ("load", "load", "Load", "LoadJob"),
          ("checks", "checks", "Checks", "CheckJob"),
          ("timed", "timed", "TimedLoop", "TimedJob"), ("baselines", "baselines", "Baselines", "BaselineJob"),
          ("memory", "memory", "Memory", "MemoryJob"), ("failures", "failures", "Failures", "FailureJob")]


@pytest.mark.parametrize("module, attribute, name, protocol", STAGES)
def test_each_stage_is_an_object_of_the_job_built_with_its_protocol(job, module, attribute, name, protocol):
    """Issue 57: the job holds each stage (no mixins); the stage takes the job as its Protocol."""
    import importlib

    stage = getattr(importlib.import_module(f"kernelagent.harness.server.{module}"), name)
    assert type(getattr(job, attribute)) is stage and getattr(job, attribute).job is job
    assert inspect.signature(stage.__init__).parameters["job"].annotation == protocol
    assert not isinstance(job, stage)


def test_the_timed_loop_holds_its_calibration(job):
    from kernelagent.harness.server.calibration import Calibration

    assert type(job.timed.calibration) is Calibration and job.timed.calibration.job is job
    assert inspect.signature(Calibration.__init__).parameters["job"].annotation == "CalibrationJob"


def used_of_the_job(path: Path) -> set[str]:
    """What a stage module reads or sets of its job: `self.job.X`, `job.X` and getattr(job, "X")."""
    import ast

    used = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute):
            owner = ast.unparse(node.value)
            if owner in ("self.job", "job"):
                used.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and node.args and ast.unparse(node.args[0]) in ("self.job", "job"):
            used.add(node.args[1].value)
    return used


# The Protocols of those a stage hands its job on to: the trace's and the evidence's functions, the
# gate (Freezable), the timed loop's calibration.
HANDED_ON = (seams.TraceJob, seams.EvidenceJob, Freezable, seams.CalibrationJob)


@pytest.mark.parametrize("module, protocol", [(m, p) for m, _, _, p in STAGES] + [("calibration", "CalibrationJob")])
def test_each_stage_uses_only_what_its_protocol_names(module, protocol):
    """A stage reaches nothing of the job that its Protocol leaves out, and its Protocol names
    nothing the stage does not reach (issue 57: each stage gets what it needs, said in a type,
    not in prose)."""
    path = Path(seams.__file__).parent / f"{module}.py"
    attributes, methods = members(getattr(seams, protocol))
    used = used_of_the_job(path)
    assert used, path
    assert sorted(used - attributes - methods) == []
    # and names nothing it does not use, beyond the Protocols of those it hands the job on to
    handed_on: set[str] = set()
    for base in getattr(seams, protocol).__mro__[1:]:
        if base in HANDED_ON:
            handed_on |= set().union(*members(base))
    assert sorted((attributes | methods) - handed_on - used) == []


# The stage objects a job Protocol names, each typed by a Protocol of seams.py (not the stage's
# class: seams.py importing the stage modules, which import seams.py, was an import circle of 11
# files): (the job's attribute, the stage's module, its class, the Protocol seams.py types it by).
STAGE_OBJECTS = [("channels", "channels", "Channels", "ChannelsStage"), ("checks", "checks", "Checks", "ChecksStage"),
                 ("failures", "failures", "Failures", "FailuresStage"), ("load", "load", "Load", "LoadStage"),
                 ("memory", "memory", "Memory", "MemoryStage"), ("baselines", "baselines", "Baselines", "BaselinesStage"),
                 ("timed", "timed", "TimedLoop", "TimedStage")]


def test_seams_imports_no_stage_module():
    """seams.py imports (typing imports count) only modules that do not import it back: no stage
    module, so the stage modules importing their job Protocols from it make no circle."""
    import ast
    import importlib

    allowed = {"kernelagent.harness.server.gate", "kernelagent.harness.server.job_record",
               "kernelagent.harness.server.verdict"}
    imported = set()
    for node in ast.walk(ast.parse(Path(seams.__file__).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
    server = {name for name in imported if name.startswith("kernelagent.harness.server")}
    assert sorted(server - allowed) == []
    for name in server:  # and none of those imports seams.py
        tree = ast.parse(Path(importlib.import_module(name).__file__).read_text(encoding="utf-8"))
        assert not [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and (node.module == seams.__name__ or any(a.name == "seams" for a in node.names))], name


def used_of_the_stage(attribute: str) -> set[str]:
    """What the stage modules (all but job.py and main.py, which hold the Job itself) use of the
    job's `attribute` stage: `job.<attribute>.X` and `self.job.<attribute>.X`."""
    import ast

    used = set()
    for path in Path(seams.__file__).parent.glob("*.py"):
        if path.name in ("job.py", "main.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and ast.unparse(node.value) in (f"job.{attribute}", f"self.job.{attribute}"):
                used.add(node.attr)
    return used


@pytest.mark.parametrize("attribute, module, name, protocol", STAGE_OBJECTS)
def test_each_stage_object_is_typed_by_a_protocol_of_what_the_stages_use(job, attribute, module, name, protocol):
    """The job Protocols type each stage attribute by seams' small Protocol of exactly what the
    other stages use of it; the stage's class has each member, its methods with the same
    parameters (names and kinds), and a built Job's stage has each attribute."""
    import importlib

    stage_protocol = getattr(seams, protocol, None)
    assert stage_protocol is not None, f"seams.py has no {protocol}"
    for job_protocol in (getattr(seams, n) for n in dir(seams) if n.endswith("Job")):
        annotation = inspect.get_annotations(job_protocol).get(attribute)
        assert annotation in (None, protocol), f"{job_protocol.__name__}.{attribute}: {annotation}"
    attributes, methods = members(stage_protocol)
    assert attributes | methods == used_of_the_stage(attribute)
    stage = getattr(importlib.import_module(f"kernelagent.harness.server.{module}"), name)
    for method in methods:
        assert callable(getattr(stage, method, None)), f"{name} has no method {method}"
        theirs = [(p.name, p.kind) for p in inspect.signature(getattr(stage, method)).parameters.values()]
        ours = [(p.name, p.kind) for p in inspect.signature(getattr(stage_protocol, method)).parameters.values()]
        assert ours == theirs, f"{protocol}.{method}"
    for name_ in attributes:
        assert hasattr(getattr(job, attribute), name_) and not callable(getattr(getattr(job, attribute), name_))
