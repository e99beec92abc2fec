"""The whole-model work that runs the user's model: in a child process, never in the caller.

    python -m kernelagent.wholemodel.child plan PROBLEM --device cpu|cuda[:N] --out DIR
    python -m kernelagent.wholemodel.child splice PROBLEM --plan PLAN --jobs JOBS.json

`plan` captures the model's forward with torch.export (dynamic sizes where torch allows), runs
the captured graph through an FX Interpreter that times each node: on a GPU in a torch.profiler
range (device time, the median of the profiled repetitions, checked against the model's own
forward), on the CPU in interleaved rounds of the graph and the model's forward on one thread
(timing.py: medians, the noise, a re-measure when the nodes sum past their forward). Then it
groups the nodes into regions (regions.py), writes each extractable region as a KernelBench
problem (DIR/regions/region_k.py: `Model`, `get_inputs()` with the region's real shapes and
dtypes and values at the captured values' scale, `get_init_inputs()`; weights and buffers are
inputs, so a region's kernel takes them as arguments and the spliced model passes the model's
own), checks that each runs, and writes DIR/plan.json.

`splice` captures the graph again the same way, replaces each named region by a call to its
kernel's `ModelNew`, and writes a model file whose `ModelNew` subclasses the original `Model`
(the same parameters) and runs the new graph: one file of code, the original model and each
kernel inlined (inline.py), no exec(). It imports nothing from kernelagent.
On the CPU a problem without get_smoke_inputs() runs at derived smoke sizes (harness/derive/).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import types
from pathlib import Path
from typing import Any
from kernelagent import pyast

REPS = 5  # profiled repetitions on a GPU (the CPU's rounds: timing.py)


class ProblemRaised(Exception):
    """The model file itself failed (at import, in get_inputs(), building Model): one line naming it."""


def _step(what: str, path: Path, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - the user's code: say which step of which file raised
        text = str(exc).splitlines()[0] if str(exc) else ""
        # Not the path: the caller names the file as the user knows it (a confined run's copy lives
        # in a scratch folder that is nobody's business).
        raise ProblemRaised(f"{what} raised {type(exc).__name__}: {text}"[:500]) from None


def load(path: Path, device: str) -> tuple[Any, list[Any], str, dict]:
    """(model, inputs, source, smoke overrides) on `device`, seeded as the harness seeds."""
    import torch

    source = path.read_text(encoding="utf-8")
    overrides: dict = {}
    module = _step("importing it", path, _exec_module, source, path)
    smoke = device == "cpu"
    if smoke and not hasattr(module, "get_smoke_inputs"):
        from kernelagent.harness import derive

        overrides, _err = derive.pick_smoke(source)
        if overrides:
            source = derive.apply(source, overrides)
            module = _step("importing it at smoke sizes", path, _exec_module, source, path)
    if not hasattr(module, "Model") or not hasattr(module, "get_inputs"):
        raise SystemExit(f"error: {path}: not a problem file (needs class Model and get_inputs())")
    init = (_step("get_smoke_init_inputs()", path, module.get_smoke_init_inputs)
            if smoke and hasattr(module, "get_smoke_init_inputs")
            else _step("get_init_inputs()", path, module.get_init_inputs) if hasattr(module, "get_init_inputs")
            else [])
    torch.manual_seed(0)
    model = _step("Model(*get_init_inputs())", path, lambda: module.Model(*init).to(device))
    inputs = (_step("get_smoke_inputs()", path, module.get_smoke_inputs)
              if smoke and hasattr(module, "get_smoke_inputs") else _step("get_inputs()", path, module.get_inputs))
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    return model, inputs, source, overrides


def _exec_module(source: str, path: Path) -> types.ModuleType:
    module = types.ModuleType("kernelagent_whole_model")
    module.__file__ = str(path)
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - the user's own model file
    return module


def export(model: Any, inputs: list[Any]) -> tuple[Any, bool]:
    """(ExportedProgram, dynamic): sizes left dynamic where torch can, else specialised."""
    import torch
    from torch.export import Dim

    dynamic = tuple({i: Dim.AUTO for i in range(x.dim())} if isinstance(x, torch.Tensor) else None for x in inputs)
    try:
        return torch.export.export(model, tuple(inputs), dynamic_shapes=dynamic, strict=False), True
    except Exception:  # noqa: BLE001 - some models only export at fixed sizes
        return torch.export.export(model, tuple(inputs), strict=False), False


def flat_args(ep: Any, inputs: list[Any]) -> list[Any]:
    """The lifted graph's arguments: parameters, buffers and constants by name, then the inputs."""
    from torch.export.graph_signature import InputKind

    state = {**ep.state_dict, **ep.constants}
    args, user = [], iter(inputs)
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            args.append(next(user))
        else:
            value = state[spec.target]
            args.append(value.clone() if spec.kind == InputKind.BUFFER else value)
    return args


def op_name(target: Any) -> str:
    packet = getattr(target, "_overloadpacket", None)
    return getattr(packet, "__name__", None) or getattr(target, "__name__", str(target))


def _mutates(node: Any) -> bool:
    schema = getattr(node.target, "_schema", None)
    if schema is not None and schema.is_mutable:
        return True
    if op_name(node.target) in ("batch_norm", "_native_batch_norm_legit_functional", "instance_norm"):
        training = node.args[5] if len(node.args) > 5 else node.kwargs.get("training", False)
        return bool(training)
    return False


def _tensor_args(node: Any) -> list[str]:
    import torch

    out: list[str] = []

    def visit(a: Any) -> None:
        if hasattr(a, "op") and hasattr(a, "name"):
            if isinstance(a.meta.get("val"), torch.Tensor) and a.name not in out:
                out.append(a.name)
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
        elif isinstance(a, dict):
            for x in a.values():
                visit(x)

    visit(node.args)
    visit(node.kwargs)
    return out


def capture(model: Any, inputs: list[Any], device: str) -> tuple[Any, list[dict], dict]:
    """(exported program, compute nodes with their times, totals)."""
    import torch
    from torch.fx import Interpreter

    from kernelagent.wholemodel.ops import kind

    ep, dynamic = export(model, inputs)
    gm = ep.graph_module
    cuda = device.startswith("cuda")
    values: dict[str, Any] = {}

    class Timed(Interpreter):
        def __init__(self, module: Any, record: bool) -> None:
            super().__init__(module, garbage_collect_values=not record)
            self.record = record

        def run_node(self, n: Any) -> Any:
            if n.op != "call_function":
                value = super().run_node(n)
            else:
                with torch.profiler.record_function("ka::" + n.name):
                    value = super().run_node(n)
            if self.record:
                values[n.name] = _summary(value)
            return value

    with torch.no_grad():
        Timed(gm, record=True).run(*flat_args(ep, inputs))
        if cuda:
            per_node = _profile_cuda(gm, ep, model, inputs, Timed)
            totals = per_node.pop("~totals")
            per_node = {name: {"time_us": t} for name, t in per_node.items()}
        else:
            per_node, totals = _rounds_cpu(gm, ep, model, inputs)
    nodes = []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        val = n.meta.get("val")
        tensor = isinstance(val, torch.Tensor)
        info = {"name": n.name, "op": op_name(n.target), "target": str(n.target),
                "kind": kind(op_name(n.target)) if tensor else "shape", "tensor": tensor,
                "args": _tensor_args(n), "users": [u.name for u in n.users],
                **_timed(per_node.get(n.name, {})), "mutates": _mutates(n),
                "shape": list(values.get(n.name, {}).get("shape") or []) if tensor else None,
                "dtype": values.get(n.name, {}).get("dtype")}
        if any(isinstance(v, torch.device) for v in [*n.args, *n.kwargs.values()]):
            info["unextractable"] = "it names a device"
        nodes.append(info)
    totals["dynamic_sizes"] = dynamic
    totals["nodes_vs_model"] = round(totals["nodes_us"] / totals["model_forward_us"], 4) \
        if totals["model_forward_us"] else None
    if cuda:
        totals["warning"] = agreement_warning(totals, cuda)
    else:
        from kernelagent.wholemodel.timing import warnings

        said = warnings(totals)
        totals["unsteady"] = next((w for w in said if w.startswith("the forward's time moved")), None)
        totals["warning"] = "\n".join(said) or None
    return ep, nodes, {"totals": totals, "values": values}


def _timed(measured: dict[str, float]) -> dict[str, float]:
    """A node's time_us, and its share and noise where the CPU's rounds measured them, rounded."""
    out = {"time_us": round(measured.get("time_us", 0.0), 3)}
    out.update({k: round(measured[k], 6) for k in ("share", "noise") if k in measured})
    return out


def _profile_cuda(gm: Any, ep: Any, model: Any, inputs: list[Any], timed: Any) -> dict[str, Any]:
    """Per node device us (median of REPS profiled repetitions), with the totals under "~totals"."""
    import torch

    for _ in range(2):
        timed(gm, record=False).run(*flat_args(ep, inputs))
        model(*inputs)
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as graph_prof:
        for _ in range(REPS):
            with torch.profiler.record_function("ka::forward"):
                timed(gm, record=False).run(*flat_args(ep, inputs))
            torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as model_prof:
        for _ in range(REPS):
            with torch.profiler.record_function("ka::forward"):
                model(*inputs)
            torch.cuda.synchronize()
    per_node: dict[str, Any] = _times(graph_prof, True)
    per_node["~totals"] = {"nodes_us": round(sum(per_node.values()), 3),
                           "graph_forward_us": round(_forward(graph_prof, True), 3),
                           "model_forward_us": round(_forward(model_prof, True), 3), "reps": REPS,
                           "clock": "device (CUDA kernels)"}
    return per_node


def _rounds_cpu(gm: Any, ep: Any, model: Any, inputs: list[Any]) -> tuple[dict, dict]:
    """({node: {time_us, share, noise}}, totals) from timing.measure(): interleaved rounds of the
    graph and the model on one thread, each node and each forward timed by the same clock."""
    import torch
    from torch.fx import Interpreter

    from kernelagent.wholemodel import timing

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # no op waits on a pool thread another process holds off the CPU

    class Spans(Interpreter):
        def __init__(self, module: Any, timer: Any) -> None:
            super().__init__(module)
            self.timer = timer

        def run_node(self, n: Any) -> Any:
            if n.op != "call_function":
                return Interpreter.run_node(self, n)
            return self.timer(n.name, lambda: Interpreter.run_node(self, n))

    def prepare() -> Any:
        args = flat_args(ep, inputs)
        return lambda timer: Spans(gm, timer).run(*args)

    try:
        for _ in range(2):  # warm up
            prepare()(lambda name, fn: fn())
            model(*inputs)
        result = timing.measure(prepare, lambda: model(*inputs))
    finally:
        torch.set_num_threads(threads)
    totals = {**result["totals"], "rounds": timing.ROUNDS,
              "clock": "CPU wall time on one thread (no GPU: not a device time)"}
    return result["per_node"], totals


def _summary(value: Any) -> dict[str, Any]:
    import torch

    if isinstance(value, torch.Tensor):
        out: dict[str, Any] = {"shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", "")}
        if value.is_floating_point() and value.numel():
            v = value.detach().float()
            out.update(mean=float(v.mean()), std=float(v.std()) if v.numel() > 1 else 0.0)
        elif value.dtype != torch.bool and value.numel():
            out.update(min=int(value.min()), max=int(value.max()))
        return out
    if isinstance(value, (int, float, bool)):
        return {"value": value}
    return {}


def _times(prof: Any, cuda: bool) -> dict[str, float]:
    """Per node, device microseconds per forward on a GPU: the device time of the kernels launched
    in its range, the median of the profiled repetitions. (The CPU's times: _rounds_cpu.)"""
    from kernelagent.wholemodel.timing import median

    samples: dict[str, list[float]] = {}
    for event in prof.events():
        if event.name.startswith("ka::") and event.name != "ka::forward":
            samples.setdefault(event.name[4:], []).append(_device_us(event))
    return {name: median(values) for name, values in samples.items()}


def _device_us(event: Any) -> float:
    return float(getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0) or 0.0)


def _forward(prof: Any, cuda: bool) -> float:
    """The forward's device time per repetition: every CUDA kernel's own device time (the
    profiler's total) over the repetitions."""
    total = sum(float(getattr(e, "self_device_time_total", 0.0) or 0.0) for e in prof.events()
                if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type))
    return total / REPS


# On either side of this band, the regions' sum and the model's own forward disagree enough for
# the plan to say so (plan.json totals.warning, printed by `kernelagent plan`).
AGREEMENT = (0.8, 1.25)


def agreement_warning(totals: dict[str, Any], cuda: bool) -> str | None:
    ratio = totals.get("nodes_vs_model")
    if ratio is None or AGREEMENT[0] <= ratio <= AGREEMENT[1]:
        return None
    said = f"the regions sum to {ratio:.0%} of the model's own forward under torch.profiler"
    if not cuda:
        return (f"{said}: on the CPU the per-op times are CPU times, swayed by Python's overhead on small ops and "
                "by other processes on this machine, so the shares and the order of the regions are a rough guide; "
                "plan on a GPU for device times")
    return (f"{said}: some of the model's device work runs outside the captured graph's ops, or the graph does "
            "work the model does not; the shares are of the graph's time")


# -- extraction ---------------------------------------------------------------------------------
def region_source(ep: Any, region: dict, values: dict, problem: str) -> str:
    """The region as a KernelBench problem: its tensor inputs (weights included) are inputs."""
    import torch
    from torch import fx

    nodes = {n.name: n for n in ep.graph_module.graph.nodes}
    graph = fx.Graph()
    env: dict[str, Any] = {}
    names = []
    for i, name in enumerate(region["inputs"]):
        arg = _safe(name, i)
        names.append(arg)
        env[name] = graph.placeholder(arg)
    members = set(region["nodes"])

    def arg_of(a: Any) -> Any:
        if a.name in env:
            return env[a.name]
        if a.name in values and "value" in values[a.name]:
            return values[a.name]["value"]  # a size the capture computed: a literal here
        raise ValueError(f"{a.name} is neither an input nor a known size")

    for name in region["nodes"]:
        env[name] = graph.node_copy(nodes[name], arg_of)
    graph.output(env[region["nodes"][-1]])
    code = fx.GraphModule(torch.nn.Module(), graph).code
    if "device(" in code:
        raise ValueError("its code names a device")
    body = "\n".join("    " + line if line.strip() else "" for line in code.strip().splitlines())
    factories = [_factory(values.get(name, {})) for name in region["inputs"]]
    ops = ", ".join(dict.fromkeys(region["ops"]))
    return (f'"""{region["id"]} of {problem}: {region["kind"]} ({ops}).\n\n'
            f"Extracted by `kernelagent plan`: the region's inputs (activations, weights and buffers) come from\n"
            f"get_inputs() at the shapes and dtypes the model gives them, and at their captured scale.\n"
            f'"""\nfrom math import inf, nan  # noqa: F401 - the captured graph may write them\n\n'
            f'import torch\nimport torch.nn as nn\n\n\n'
            f"class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n{body}\n\n\n"
            f"def get_inputs():\n    return [{', '.join(factories)}]\n\n\n"
            f"def get_init_inputs():\n    return []\n")


def _safe(name: str, i: int) -> str:
    clean = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return clean if clean and not clean[0].isdigit() else f"arg{i}_{clean}"


def _factory(info: dict) -> str:
    shape = tuple(info.get("shape") or ())
    dtype = info.get("dtype") or "float32"
    if dtype == "bool":
        return f"torch.rand({shape}) > 0.5"
    if "int" in dtype:
        lo, hi = int(info.get("min", 0)), int(info.get("max", 1))
        return f"torch.randint({lo}, {hi + 1}, {shape}, dtype=torch.{dtype})"
    std = float(info.get("std") or 0.0)
    mean = float(info.get("mean") or 0.0)
    std = std if math.isfinite(std) and std > 0 else 1.0
    mean = mean if math.isfinite(mean) else 0.0
    scale = f" * {std:.6g}" if abs(std - 1.0) > 1e-6 else ""
    shift = f" + {mean:.6g}" if abs(mean) > 1e-6 else ""
    return f"(torch.randn({shape}){scale}{shift}).to(torch.{dtype})"


def check_region(source: str, path: Path, device: str) -> str | None:
    """None when the extracted problem runs as a reference; else why not."""
    import torch

    try:
        module = _exec_module(source, path)
        torch.manual_seed(0)
        model = module.Model(*module.get_init_inputs()).to(device)
        inputs = [x.to(device) for x in module.get_inputs()]
        with torch.no_grad():
            model(*inputs)
    except Exception as exc:  # noqa: BLE001 - the region is then left in the model
        return f"the extracted problem does not run: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return None


def plan(problem: Path, device: str, out: Path) -> dict:
    from kernelagent.wholemodel.regions import group

    model, inputs, source, overrides = load(problem, device)
    ep, nodes, extra = capture(model, inputs, device)
    regions = group(nodes)
    folder = out / "regions"
    folder.mkdir(parents=True, exist_ok=True)
    for region in regions:
        if not region["extractable"]:
            continue
        try:
            text = region_source(ep, region, extra["values"], problem.name)
        except ValueError as exc:
            region.update(extractable=False, why_not=str(exc))
            continue
        path = folder / f"{region['id']}.py"
        why = check_region(text, path, device)
        if why:
            region.update(extractable=False, why_not=why)
            continue
        path.write_text(text, encoding="utf-8")
        region["problem"] = str(path)
    data = {"format": 1, "problem": str(problem), "device": device, "smoke_overrides": overrides,
            "totals": extra["totals"], "regions": regions, "nodes": nodes}
    (out / "plan.json").write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
    return data


# -- splicing -----------------------------------------------------------------------------------
def splice(problem: Path, plan_data: dict, jobs: list[tuple[dict[str, str], Path]], device: str) -> dict[str, str]:
    """Each job ({region id: kernel source}, output file) written from one capture of the model
    (a child's start and torch.export are paid once for a run's splices). Returns {output: why}
    for the jobs that failed."""
    model, inputs, source, _ = load(problem, device)
    ep, _dynamic = export(model, inputs)
    failed: dict[str, str] = {}
    for kernels, out in jobs:
        try:
            text = _splice_one(ep, problem, source, plan_data, kernels)
        except Exception as exc:  # noqa: BLE001 - this job's kernels: the caller leaves them out
            failed[str(out)] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    return failed


def _splice_one(ep: Any, problem: Path, source: str, plan_data: dict, kernels: dict[str, str]) -> str:
    import torch
    from torch import fx
    from torch.export.graph_signature import InputKind

    regions = {r["id"]: r for r in plan_data["regions"] if r["id"] in kernels}
    owner = {name: r for r in regions.values() for name in r["nodes"]}
    graph = fx.Graph()
    env: dict[str, Any] = {}
    for node in ep.graph_module.graph.nodes:
        region = owner.get(node.name)
        if region is None:
            env[node.name] = graph.node_copy(node, lambda a: env[a.name])
        elif node.name == region["output"]:
            env[node.name] = graph.call_module(region["id"], tuple(env[i] for i in region["inputs"]))
    root = torch.nn.Module()
    for rid in regions:
        root.add_module(rid, torch.nn.Identity())
    body = fx.GraphModule(root, graph).code.strip().replace("def forward(self,", "def _graph(self,", 1)
    order = [(spec.kind.name, spec.target) for spec in ep.graph_signature.input_specs
             if spec.kind != InputKind.USER_INPUT]
    n_out = len(ep.graph_signature.user_outputs)
    return _spliced_file(problem, source, kernels, order, body, n_out)


def _spliced_file(problem: Path, source: str, kernels: dict[str, str], order: list, body: str, n_out: int) -> str:
    """The spliced model as one file of code (wholemodel/inline.py): the original model as written,
    each kernel with its module-level names prefixed `_<region>_`, the captured graph with the
    regions replaced, and `ModelNew`. Nothing runs through exec(), so the harness counts the
    kernels' launches as the candidate's own and Triton reads their source from this file."""
    import ast

    from kernelagent.wholemodel.e2e import MARK
    from kernelagent.wholemodel.inline import bindings, inline, split_futures

    futures, original = split_futures(source)
    taken = bindings(pyast.parse(original))  # the model's names stay as written; a kernel's may not shadow them
    parts = []
    for rid, text in kernels.items():
        done = inline(text, f"_{rid}_", f"the kernel of {rid}", taken)
        futures += done.futures
        if "ModelNew" not in done.names:
            raise ValueError(f"the kernel of {rid} defines no ModelNew")
        parts.append((rid, done))
    graph = inline(f"import math\nimport torch\nfrom math import inf, nan\nfrom torch import device\n\n\n{body}\n",
                   "_kernelagent_graph_", taken=taken)
    graph_code = graph.code
    heads = "\n".join(dict.fromkeys(futures))
    kernel_code = "".join(f"\n\n# -- {rid}: its verified kernel (module-level names prefixed _{rid}_) "
                          f"{'-' * max(0, 40 - len(rid))}\n{done.code}\n" for rid, done in parts)
    modules = "".join(f"\n        self.add_module({rid!r}, _{rid}_ModelNew())" for rid in kernels)
    return f'''"""{problem.name} with its hot regions replaced by verified kernels ({MARK}).

Regions replaced: {", ".join(kernels) or "none"}. `ModelNew` subclasses the original `Model`, so it
has the same parameters, and runs the model's captured graph with each region replaced by its
kernel's `ModelNew` (weights passed in). Runs without kernelagent installed. To judge it again
with the rules of the run's end-to-end check (PyTorch runs the regions not replaced):

    kernelagent eval {problem.name} THIS_FILE --whole-model
"""
{heads}

# -- the original model, as written ({problem.name}) ------------------------------------------
{original.strip()}
{kernel_code}

# -- the model's captured graph, each replaced region a call to its kernel ------------------------
{graph_code}

_kernelagent_STATE = {order!r}
_kernelagent_OUTPUTS = {n_out}


class ModelNew(Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs){modules}

    def _kernelagent_state(self, kind, target):
        if kind == "PARAMETER":
            return self.get_parameter(target)
        if kind == "BUFFER":
            return self.get_buffer(target)
        obj = self
        for part in target.split("."):
            obj = getattr(obj, part)
        return obj

    def forward(self, *inputs):
        out = _kernelagent_graph__graph(self, *[self._kernelagent_state(k, t) for k, t in _kernelagent_STATE],
                                        *inputs)
        return out[0] if _kernelagent_OUTPUTS == 1 and isinstance(out, (tuple, list)) else out
'''


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kernelagent.wholemodel.child")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("problem", type=Path)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("splice")
    s.add_argument("problem", type=Path)
    s.add_argument("--plan", type=Path, required=True)
    s.add_argument("--device", default="cpu")
    s.add_argument("--jobs", type=Path, required=True, help='JSON: [{"out": FILE, "kernels": {REGION: PATH}}]')
    args = parser.parse_args(argv)
    try:
        if args.cmd == "plan":
            args.out.mkdir(parents=True, exist_ok=True)
            data = plan(args.problem, args.device, args.out)
            print("KERNELAGENT_PLAN " + json.dumps({"regions": len(data["regions"])}))
        else:
            jobs = [({rid: Path(path).read_text(encoding="utf-8") for rid, path in job["kernels"].items()},
                     Path(job["out"])) for job in json.loads(args.jobs.read_text(encoding="utf-8"))]
            failed = splice(args.problem, json.loads(args.plan.read_text()), jobs, args.device)
            print("KERNELAGENT_SPLICED " + json.dumps({"failed": failed}))
    except SystemExit:
        raise
    except ProblemRaised as exc:
        print(f"KERNELAGENT_ERROR {exc}"[:600])
        sys.exit(3)
    except Exception as exc:  # noqa: BLE001 - one line for the caller, which says what failed
        print(f"KERNELAGENT_ERROR {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:600])
        sys.exit(3)


if __name__ == "__main__":
    main()
