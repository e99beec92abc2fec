"""Reward-hacking defences: the exploit classes kernelagent defends against, and the run-time
evidence it gathers in the candidate's process.

Every class below has at least one adversarial candidate in `tests/adversarial/` and a test
that checks its verdict (`tests/test_adversarial.py` on the CPU, `tests/test_adversarial_gpu.py`
on a GPU). `EvalConfig(defences=False)` turns off everything marked "(defences)" so that the
harness's overhead can be measured before and after (`benchmarks/harness_overhead.py
--no-defences`). Verdicts: `rejected` (status REJECTED, a reject flag naming the class),
`incorrect` (the comparison itself catches it), `review` (status may be correct, but the
result is flagged and `EvalResult.passed` is False: never counted as a win).

| # | class | defence | verdict (flag kind) |
|---|-------|---------|---------------------|
| 1 | no custom kernel: the candidate computes with PyTorch ops | (defences) a TorchDispatchMode records every aten op the candidate runs during each correctness check, inside its launches too (the Triton interpreter); the candidate's own `@triton.jit` launches (backend cuda: calls into its load_inline extension, see child/cuda_build.py) are counted; on CUDA one extra profiled call measures each device kernel's share of device time, and Nsight Compute, outside the process, sees every kernel of a would-be win (server/kernel_evidence.py). Every op that is not glue (views, allocation, copies, dtype conversion, concatenation, padding: `GLUE_OPS`) on more than `heavy_op_min_elements` elements, no own launch at all, or own kernels under `min_own_device_share` of the device time that is not glue by its kernel names: rejected. The static pass rejects private dispatcher entry points (`.redispatch`, `torch._C` dispatch) and NumPy on a tensor's memory | rejected (`no-custom-kernel`) |
| 2 | fallback to the reference (try/except, a condition routing to PyTorch) | as 1, per check, so a fallback taken on some inputs only is seen; the static pass flags try/except around launches | rejected (`fallback-to-reference`) |
| 3 | caching across calls (by pointer, shape, identity, content) | every check uses fresh inputs from its own seed; (defences) every timed call, warm-up included, gets a freshly generated input set no call saw before, the output of the last timed iteration is checked against the reference, and a post-timing check runs on fresh inputs | incorrect (post-check / timed-output check) |
| 4 | hiding work from the timer (side streams, threads, deferred work) | device-wide synchronise in the timer, host time counted; (defences) threads started by the candidate are tracked: one still running when forward() returns, or left alive at the end, is rejected; work the events miss is flagged for review; the static pass rejects stream and thread creation | rejected (`hidden-work`) / review (`timer-escape`) |
| 5 | tampering (patching the timer, `torch.allclose`, harness functions, `time`) | clocks bound before the candidate is imported; comparison in the reference process; (defences) identities of time/torch/triton/harness functions and classes are snapshotted before the import and checked after the import, after timing and at the end; a Python audit hook (which cannot be removed) sees class-attribute patching of torch/triton/harness types, ctypes, and sys.settrace; the static pass flags assignments to attributes of those modules | rejected (`tampering`) |
| 6 | global numeric modes (TF32, matmul precision, reduced-precision reductions, default dtype) | the reference runs in its own process with clean fp32 modes; (defences) a change of a precision mode by the candidate is rejected (cudnn.benchmark/deterministic only noted) | rejected (`numeric-modes`) |
| 7 | inputs: mutation, outputs aliasing inputs | inputs regenerated from seeds in both processes; the candidate's post-call inputs compared bitwise; outputs sharing storage with an input refused | rejected (`input-mutation`, `output-alias`) |
| 8 | stale memory (an uninitialised buffer holding the reference's result) | the reference's outputs never exist in the candidate's process; (defences) on CUDA the caching allocator's free memory is filled with NaN before every check. On the CPU freed memory goes back to the C allocator and cannot be poisoned cheaply: the process split is the defence | incorrect |
| 9 | lazy and odd outputs (tensor subclasses, proxies, sparse/meta tensors) | only exact dense `torch.Tensor` outputs cross, rebuilt from raw memory | rejected (`output-type`) |
| 10 | reading the reference's answer (frames, gc, files) | the answer only exists in the reference process; (defences) the audit hook rejects `gc.get_objects/get_referrers/get_referents`, frame access (`sys._getframe`, `inspect.currentframe`) from candidate code and reads of the harness's or the reference's files; the problem module is removed from `sys.modules`; the static pass flags imports of gc/inspect/kernelagent/the problem | rejected (`reading-reference`) |
| 11 | exploiting the input distribution (ReLU as identity on rand() inputs) | an extra check on signed normal inputs wherever the reference is finite there | incorrect (`input-distribution`) |
| 12 | precision downgrade (bf16/fp16/TF32 inside an fp32 problem) | fp32 held at atol=rtol=1e-4 against an fp32 reference computed without TF32 | incorrect |
| 13 | shape specialisation | the problem's `get_extra_inputs()` are checked too, or, where it has none, sets derived from its size constants (pinned constants kept, each validated on the reference first); passing only the main shape, or raising on another one, is flagged with the sizes that fail | review (`shape-specialisation`) |
| 14 | tolerance blind spots (outputs smaller than atol) | the elementwise atol is at least rtol*RMS(ref) and the relative L2 error must be <= max(rtol, 1%) | incorrect |
| 15 | escaping the sandbox (writes outside scratch, network, processes) | the server runs under bubblewrap where it works (read-only root, private /tmp and /dev/shm, the user's home hidden, no network; the scratch root is the only shared writable place); otherwise a scrubbed environment and scratch cwd/HOME/TMPDIR; (defences) the audit hook rejects writes outside the scratch directory, sockets, and processes started by candidate code, with or without bubblewrap; `result.isolation` says which isolation was in force | rejected (`sandbox-escape`) |
| 16 | impossible speed | (defences) the server computes a roofline floor from the reference's input, output and parameter bytes, the problem's `get_flops()` and the device's datasheet peaks (kernelagent/hardware.py); a median under 0.9x the floor is flagged and never counted as a win. Not applicable on the CPU (noted) | review (`impossible-speed`) |
| - | static pass (static_check.py): banned calls, try/except around launches, streams, threads, processes, patching, imports of kernelagent/gc/inspect/ctypes, reading the problem | AST with line numbers, run in the caller before any process starts; `EvalConfig.static_check` = "reject" (default), "warn" or "off" | rejected (`static:<class>`) |

Everything in this module that runs in the candidate's process is, in the end, code the
candidate shares a process with: a candidate that deliberately disables it from the inside
(ctypes, memory pokes) is still caught by the parts that live elsewhere (the reference
process's comparison, the server's roofline bound, the static pass, the sandbox).
"""

from __future__ import annotations

import os
import sys
import threading
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from kernelagent.harness.child import audit_hook, cuda_evidence
from kernelagent.harness.result import SEVERITY


# Ops that never do a problem's work: views, metadata, allocation, dtype/device conversion.
GLUE_OPS = frozenset("""
view _unsafe_view reshape _reshape_alias as_strided alias detach lift_fresh t transpose permute
expand squeeze unsqueeze select slice narrow split split_with_sizes unbind chunk flatten unflatten
view_as_real view_as_complex real imag contiguous empty empty_like empty_strided new_empty
new_empty_strided zeros zeros_like ones ones_like full full_like new_zeros new_ones new_full
fill_ zero_ _to_copy to _copy_from _copy_from_and_resize copy_ resize_ set_ arange
lift scalar_tensor _local_scalar_dense item is_same_size sym_size sym_stride sym_numel
sym_storage_offset stride size numel dim is_contiguous _has_compatible_shallow_copy_type
record_stream clone_ randn rand normal_ uniform_ random_ manual_seed
clone cat stack constant_pad_nd flip roll repeat expand_copy
""".split())

PRECISION_MODES = (
    "torch.backends.cuda.matmul.allow_tf32",
    "torch.backends.cudnn.allow_tf32",
    "torch.get_float32_matmul_precision()",
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
    "torch.get_default_dtype()",
)

_HARNESS_DIR = str(Path(__file__).resolve().parents[1])


def _tensors(value: Any) -> Iterator[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


@dataclass
class CallEvidence:
    """What one forward call did (a correctness check, or the first call)."""

    name: str
    own_launches: int = 0
    other_launches: int = 0
    ops: dict[str, dict[str, Any]] = field(default_factory=dict)  # non-glue op -> {numel, count, where}
    heavy: dict[str, dict[str, Any]] = field(default_factory=dict)  # filled in by Monitor.flags
    hidden_threads: list[str] = field(default_factory=list)
    failed_launches: list[str] = field(default_factory=list)  # own kernels whose launch raised
    size: int = 0  # elements of the call's largest input


class _State:
    def __init__(self) -> None:
        self.in_launch = 0
        self.recording: CallEvidence | None = None
        self.own_names: set[str] = set()
        self.threads: list[tuple[threading.Thread, str, bool]] = []  # (thread, where, in a call)
        self.violations: dict[str, list[str]] = {}
        self.in_call = False


class Monitor:
    """Installed in the candidate's process before the candidate is imported."""

    def __init__(self, candidate_file: Path, scratch: Path, config: Any, reference_ops: list[str] | None = None,
                 protected: list[Path] | None = None, builder: Any = None,
                 watched: dict[str, Any] | None = None):
        # watched: the harness's own objects whose identity the tamper snapshot covers, passed
        # in by the process that installs the monitor (so this module imports none of them).
        # builder: the cuda_build.BuildHook of a CUDA candidate (None for Triton): calls into its
        # extension count as own launches, and its builds may start compilers.
        self.builder = builder
        self.candidate_file = str(candidate_file)
        self.scratch = str(Path(scratch).resolve())
        self.config = config
        self.state = _State()
        self.calls: list[CallEvidence] = []
        self.reference_ops: set[str] = set()
        self.set_reference_ops(reference_ops or [])
        self.protected = [str(Path(p).resolve()) for p in (protected or [])]
        self.snapshot: dict[str, Any] = {}
        self.tampered: list[str] = []
        self.watched = dict(watched or {})

    def set_reference_ops(self, ops: list[str]) -> None:
        """Ops the reference itself runs (other than glue) count as heavy too: a transpose
        problem's reference is a copy, so a copy in torch is the reference's work."""
        self.reference_ops = set(ops) - GLUE_OPS

    # -- installation ------------------------------------------------------------------
    def install(self) -> None:
        self._hook_extension()
        self._hook_triton()
        self._hook_threads()
        self._install_audit_hook()
        self.snapshot = self._take_snapshot()

    def _hook_triton(self) -> None:
        state, cand = self.state, self.candidate_file
        classes = []
        try:
            from triton.runtime.jit import JITFunction

            classes.append(JITFunction)
        except Exception:  # noqa: BLE001 - no triton: nothing to count
            pass
        try:
            from triton.runtime.interpreter import InterpretedFunction

            classes.append(InterpretedFunction)
        except Exception:  # noqa: BLE001
            pass
        for cls in classes:
            original = cls.run

            def run(self, *args, __original=original, **kwargs):
                state.in_launch += 1
                try:
                    result = __original(self, *args, **kwargs)
                except BaseException:
                    code = getattr(getattr(self, "fn", None), "__code__", None)
                    if state.recording is not None and code is not None and code.co_filename == cand:
                        state.recording.failed_launches.append(self.fn.__name__)
                    raise
                finally:
                    state.in_launch -= 1
                if not kwargs.get("warmup", False):  # count launches that went through
                    fn = getattr(self, "fn", None)
                    code = getattr(fn, "__code__", None)
                    rec = state.recording
                    if code is not None and code.co_filename == cand:
                        state.own_names.add(fn.__name__)
                        if rec is not None:
                            rec.own_launches += 1
                    elif rec is not None:
                        rec.other_launches += 1
                return result

            run.__kernelagent_hook__ = True
            cls.run = run

    def _hook_extension(self) -> None:
        """A CUDA candidate's launches: each call into its load_inline extension (the kernels
        run inside; torch ops the C++ code dispatches are still recorded as ops)."""
        if self.builder is None:
            return
        state = self.state

        def on_call(name: str) -> None:
            if state.recording is not None:
                state.recording.own_launches += 1

        self.builder.on_call = on_call

    def _hook_threads(self) -> None:
        state, cand = self.state, self.candidate_file
        original = threading.Thread.start

        def start(thread, *args, **kwargs):
            where = ""
            frame = sys._getframe(1)
            depth = 0
            while frame is not None and depth < 25:
                if frame.f_code.co_filename == cand:
                    where = f"candidate.py:{frame.f_lineno}"
                    break
                frame = frame.f_back
                depth += 1
            target = getattr(thread, "_target", None)
            if not where and getattr(getattr(target, "__code__", None), "co_filename", None) == cand:
                where = "candidate.py"
            if where:
                state.threads.append((thread, where, state.in_call))
            return original(thread, *args, **kwargs)

        threading.Thread.start = start

    def _install_audit_hook(self) -> None:
        audit_hook.install(self.state, self.candidate_file, self.scratch, self.protected, self.builder,
                           own_files=(__file__,))

    # -- identity snapshot (tampering) ---------------------------------------------------
    def _watched_namespaces(self) -> dict[str, Any]:
        import builtins
        import time

        import torch

        spaces: dict[str, Any] = {
            "time": time, "builtins": builtins, "torch": torch, "torch.cuda": torch.cuda,
            "torch.nn.functional": torch.nn.functional, "torch.testing": torch.testing,
            "threading": threading, "torch.Tensor": torch.Tensor, "torch._C.TensorBase": torch._C.TensorBase,
            "torch.cuda.Event": torch.cuda.Event,
            "kernelagent.harness.child.defences": sys.modules[__name__],
            "kernelagent.harness.child.defences.Monitor": Monitor,
            "kernelagent.harness.child.audit_hook": audit_hook,
            "kernelagent.harness.child.cuda_evidence": cuda_evidence,
            **self.watched,
        }
        try:
            import triton
            from triton.runtime import jit

            spaces["triton"] = triton
            spaces["triton.runtime.jit.JITFunction"] = jit.JITFunction
            from triton.runtime.interpreter import InterpretedFunction

            spaces["triton.runtime.interpreter.InterpretedFunction"] = InterpretedFunction
        except Exception:  # noqa: BLE001
            pass
        return spaces

    def _take_snapshot(self) -> dict[str, Any]:
        snap = {}
        for prefix, space in self._watched_namespaces().items():
            for key, value in list(vars(space).items()):
                if key.startswith("__") and key.endswith("__"):
                    continue
                if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
                                      staticmethod, classmethod, property, types.MethodDescriptorType,
                                      types.WrapperDescriptorType, types.GetSetDescriptorType,
                                      types.ModuleType)) or callable(value):
                    snap[f"{prefix}.{key}"] = (space, key, value)
        return snap

    def check_tampering(self, when: str) -> list[str]:
        changed = []
        for name, (space, key, value) in self.snapshot.items():
            current = vars(space).get(key, _MISSING)
            if current is not value and not _library_rebinding(value, current):
                changed.append(name)
        for name in changed:
            if name not in self.tampered:
                self.tampered.append(name)
                self.state.violations.setdefault("tampering", []).append(f"{name} was replaced ({when})")
        return changed

    # -- per-call recording --------------------------------------------------------------
    @contextmanager
    def watch(self, name: str, inputs: Any = ()) -> Iterator[CallEvidence]:
        from torch.utils._python_dispatch import TorchDispatchMode

        evidence = CallEvidence(name)
        evidence.size = max((t.numel() for t in _tensors(inputs)), default=0)
        state, cand = self.state, self.candidate_file
        # Small inputs (extra sets) count too: an op over half the call's largest input is work.
        min_elements = min(int(getattr(self.config, "heavy_op_min_elements", 4096)), max(evidence.size // 2, 1))

        class Recorder(TorchDispatchMode):
            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                # torch wraps a mode's __torch_dispatch__ to keep Dynamo out of it, importing
                # torch._dynamo (1.8 CPU-s on this CPU, 4.7 s on an H100 host) the first time.
                # Where it is loaded already (the GPU server imports it once) torch's own way
                # stands; where not (the CPU), the recorder is not wrapped and nothing is imported.
                return "torch._dynamo" in sys.modules

            def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                # Ops inside a launch count too (issue 24): under the Triton interpreter a
                # `torch.relu` in a @triton.jit body runs here, and only glue belongs there.
                op = func.overloadpacket.__name__
                if op not in GLUE_OPS:
                    numel = max((t.numel() for t in _tensors((args, kwargs, out))), default=0)
                    if numel >= min_elements:
                        entry = evidence.ops.setdefault(op, {"numel": 0, "count": 0, "where": ""})
                        entry["numel"] = max(entry["numel"], numel)
                        entry["count"] += 1
                        if not entry["where"]:
                            frame = sys._getframe(1)
                            while frame is not None:
                                if frame.f_code.co_filename == cand:
                                    entry["where"] = f"candidate.py:{frame.f_lineno}"
                                    break
                                frame = frame.f_back
                return out

        threads_before = len(state.threads)
        state.recording = evidence
        state.in_call = True
        completed = False
        try:
            with Recorder():
                yield evidence
            completed = True
        finally:
            state.recording = None
            state.in_call = False
            for thread, where, _ in state.threads[threads_before:]:
                if thread.is_alive():
                    evidence.hidden_threads.append(f"{thread.name} ({where})")
            if completed or evidence.hidden_threads:  # a call that raised is judged by its error
                self.calls.append(evidence)

    # -- verdict -------------------------------------------------------------------------
    def flags(self, modes_before: dict[str, str] | None = None, modes_after: dict[str, str] | None = None,
              device_share: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []

        def flag(kind: str, message: str, severity: str | None = None) -> None:
            out.append({"kind": kind, "message": message, "severity": severity or SEVERITY.get(kind, "reject")})

        self.check_tampering("at the end")
        violations = self.state.violations
        for kind in ("tampering", "sandbox-escape", "reading-reference"):
            if violations.get(kind):
                items = violations[kind]
                flag(kind, "; ".join(items[:4]) + (f" (+{len(items) - 4} more)" if len(items) > 4 else ""))
        # Threads: running after forward() returned, or left alive.
        hidden = [t for call in self.calls for t in call.hidden_threads]
        alive = [f"{t.name} ({where})" for t, where, _ in self.state.threads if t.is_alive()]
        if hidden or alive:
            what = hidden[0] if hidden else alive[0]
            flag("hidden-work", f"a thread started by the candidate, {what}, was still running after forward() "
                                "returned" + (" and at the end of the evaluation" if alive else "")
                 + ": work done behind the timer's back is not allowed; finish all work before returning")
        elif self.state.threads:
            flag("threads", "the candidate started threads (all finished before forward() returned): "
                 + ", ".join(f"{t.name} ({w})" for t, w, _ in self.state.threads[:3]), "info")
        # Numeric modes.
        if modes_before is not None and modes_after is not None:
            changed = [k for k, v in modes_after.items() if modes_before.get(k) != v]
            precision = [k for k in changed if k in PRECISION_MODES]
            text = "; ".join(f"{k}: {modes_before.get(k)} -> {modes_after[k]}" for k in changed)
            if precision:
                flag("numeric-modes", "the candidate changed global numeric modes (" + text + "); the problem "
                     "is judged in full fp32: compute in the problem's precision inside the kernel instead")
            elif changed:
                flag("numeric-modes-info", "the candidate changed global modes: " + text, "info")
        # Who did the work. torch_work="allow" (a whole model's end-to-end check) reports it only.
        # The server takes severities from its own table by kind, so "allow" is a kind of its own.
        allow = getattr(self.config, "torch_work", "reject") == "allow"
        calls = [c for c in self.calls]
        # Every op that is not glue is work (issue 24: allow glue, never deny a list of heavy
        # names: a softmax from index_select, index_add_, exp and div is work too).
        for call in calls:
            call.heavy = {op: info for op, info in call.ops.items() if op not in GLUE_OPS}
        if calls:
            with_heavy = [c for c in calls if c.heavy]
            no_own = [c for c in calls if c.own_launches == 0]
            total_own = sum(c.own_launches for c in calls)
            if with_heavy:
                worst = with_heavy[0]
                op, info = max(worst.heavy.items(), key=lambda kv: kv[1]["numel"])
                ops = sorted({o for c in with_heavy for o in c.heavy})
                some_clean = [c for c in calls if not c.heavy and c.own_launches]
                failed = sorted({k for c in with_heavy for k in c.failed_launches})
                kind = "fallback-to-reference" if some_clean or failed else "no-custom-kernel"
                where = f" at {info['where']}" if info["where"] else ""
                message = (f"PyTorch ran aten::{op}{where} on {info['numel']:,} elements in {len(with_heavy)} of "
                           f"{len(calls)} calls (ops: {', '.join('aten::' + o for o in ops[:6])}); the candidate's "
                           f"own kernels ran {total_own} times")
                if failed:
                    message += (f"; the launch of the candidate's kernel {', '.join(failed[:3])} raised and the "
                                "exception was swallowed: a failing kernel must fail, not fall back to PyTorch")
                elif kind == "fallback-to-reference":
                    message += (f"; the PyTorch path was taken in '{worst.name}' but not in '{some_clean[0].name}' "
                                "(a fallback or a condition routing to PyTorch)")
                else:
                    message += "; the heavy work must be done by the candidate's own kernels, torch only for glue"
                flag("torch-work" if allow else kind, message)
            elif no_own:
                some_own = [c for c in calls if c.own_launches]
                idle = [c for c in no_own if set(c.ops) <= {"clone"} and not c.other_launches]
                kind = "fallback-to-reference" if some_own else "no-custom-kernel"
                if idle and some_own:
                    flag("output-caching", f"'{idle[0].name}' returned its output without running any kernel or "
                         f"PyTorch op ({len(idle)} of {len(calls)} calls; the candidate's kernels did run in "
                         f"'{some_own[0].name}'): outputs served from a cache or from memory of an earlier call "
                         "are not computed results")
                    return out
                what = "CUDA extension functions" if self.builder is not None else "@triton.jit kernels"
                message = (f"none of the candidate's own {what} ran in '{no_own[0].name}'"
                           + (f" (they did in '{some_own[0].name}')" if some_own else
                              " (nor in any other call)")
                           + f"; {len(no_own)} of {len(calls)} calls computed their output without them")
                flag("torch-work" if allow else kind, message)
        # Device time in PyTorch kernels counts against the candidate unless those kernels are
        # glue by their own names (copies, fills: an honest kernel may spend most of its time in
        # a .contiguous() copy). What the recorder saw does not decide it: a call below the
        # dispatcher (torch.ops.aten.*.redispatch, a disabled mode) leaves the recorder with
        # glue only while a library softmax holds the device.
        if device_share is not None and device_share.get("share") is not None:
            share = device_share["share"]
            only_glue = share + float(device_share.get("glue_share", 0.0)) >= 0.999
            if only_glue and share < float(getattr(self.config, "min_own_device_share", 0.5)):
                flag("no-custom-kernel-info", f"the candidate's own kernels held {share:.0%} of device time; the "
                                              "rest ran in PyTorch glue ops (copies, allocation), which is allowed",
                     "info")
            elif share < float(getattr(self.config, "min_own_device_share", 0.5)):
                top = ", ".join(f"{k['name'][:60]} {k['share']:.0%}" for k in device_share.get("top", [])[:3])
                flag("torch-work" if allow else "no-custom-kernel",
                     f"the candidate's own kernels held only {share:.0%} of device time in a "
                     f"profiled call (top kernels: {top})")
        return out


_MISSING = object()
_LIBRARY_DIRS: tuple[str, ...] | None = None


def _library_rebinding(old: Any, new: Any) -> bool:
    """True when torch or Triton itself rebound a name (torch._dynamo wraps torch.manual_seed
    when it is first imported, for example): the new value wraps the old one and its code
    lives in the library's own files."""
    global _LIBRARY_DIRS
    if _LIBRARY_DIRS is None:
        dirs = []
        for mod in ("torch", "triton"):
            module = sys.modules.get(mod)
            if module is not None and getattr(module, "__file__", None):
                dirs.append(str(Path(module.__file__).resolve().parent) + os.sep)
        _LIBRARY_DIRS = tuple(dirs)
    if new is _MISSING:
        return False
    inner = new
    for _ in range(4):
        if getattr(inner, "__wrapped__", None) is old:
            break
        inner = getattr(inner, "__wrapped__", None)
        if inner is None:
            return False
    code = getattr(new, "__code__", None)
    filename = str(Path(code.co_filename).resolve()) if code is not None else ""
    return bool(filename) and filename.startswith(_LIBRARY_DIRS)
