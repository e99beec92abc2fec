"""The two processes of one evaluation, both forked from the harness server.

reference process (trusted): loads the problem, builds `Model`, computes reference outputs
    and compares what the candidate sends it. Later it times the baselines. Candidate code
    never runs here, and the reference's outputs never leave it.
candidate process (untrusted): imports the candidate, builds `ModelNew`, runs it on inputs
    made from the same seeds, and sends its outputs (and its inputs as it left them) to the
    reference process. It also runs the timing loop, with clocks bound before the candidate
    was imported.

Every message to the server is JSON (see channel.py); the server trusts verdicts only from
the reference process.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import traceback
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch

from kernelagent import hardware
from kernelagent.harness import channel, compare, defences, inputs as inputs_mod, timing, transfer
from kernelagent.harness.config import EvalConfig

_perf_counter = timing._perf_counter  # bound before any candidate code exists


def child_setup(log_path: Path, workdir: Path, close: list[Connection]) -> None:
    """First thing in a forked child: own process group, die with the server, own log,
    own working directory, and none of the other processes' pipe ends."""
    os.setpgid(0, 0)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    for conn in close:
        conn.close()
    log_fd = os.open(str(log_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.chdir(workdir)
    os.environ["HOME"] = str(workdir)
    os.environ["TMPDIR"] = str(workdir)
    os.environ["TRITON_CACHE_DIR"] = str(workdir / ".triton")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(workdir / ".inductor")
    # CUDA extensions (backend cuda) build here: one directory per job, so parallel builds
    # never share a build directory or its lock (cuda_build.py).
    os.environ["TORCH_EXTENSIONS_DIR"] = str(workdir / ".torch_extensions")
    import tempfile

    tempfile.tempdir = str(workdir)  # not the server's cached choice (the shared scratch root)


def compact_traceback(exc: BaseException, focus_file: str | None = None, limit: int = 6) -> str:
    """The exception with the frames that matter: those in `focus_file` when given."""
    frames = traceback.extract_tb(exc.__traceback__)
    if focus_file:
        mine = [f for f in frames if f.filename.endswith(focus_file)]
        frames = traceback.StackSummary.from_list(mine[-limit:] or frames[-2:])
    else:
        frames = traceback.StackSummary.from_list(frames[-limit:])
    lines = [f"  {Path(f.filename).name}:{f.lineno} in {f.name}: {(f.line or '').strip()}" for f in frames]
    message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if len(message) > 1500:
        message = message[:1200] + "\n... [cut] ...\n" + message[-300:]
    return "\n".join(lines + [message])


def clean_numeric_modes() -> None:
    """Full fp32 everywhere: no TF32 in cuBLAS or cuDNN (cuDNN allows it for convolutions by
    default). The reference is computed, and the baselines timed, this way; the candidate's
    process starts this way too, and any change it makes is reported."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def _device(job: dict[str, Any]) -> torch.device:
    clean_numeric_modes()
    device = torch.device(job["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        timing._cuda_synchronize()


def import_problem(job: dict[str, Any], workdir: Path) -> Any:
    """The problem module, executed from the source the caller sent (trusted) rather than
    from the file on disk, which a candidate sharing the scratch root could rewrite. The file
    is still there for tracebacks."""
    import types as types_mod

    source = job.get("problem_source")
    path = workdir / "problem.py"
    if source is None:
        return inputs_mod.import_file(path, "kernelagent_problem")
    module = types_mod.ModuleType("kernelagent_problem")
    module.__file__ = str(path)
    sys.modules["kernelagent_problem"] = module
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - the problem is trusted
    return module


def _op_names(model: Any, values: list[Any]) -> list[str]:
    """The aten ops (other than views and allocation) that one call of the reference runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class Names(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            seen.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Names():
        model(*values)
    return sorted(seen - defences.GLUE_OPS)


def _tensor_inputs(values: list[Any]) -> list[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor)]


# --------------------------------------------------------------------------------------
# The reference process
# --------------------------------------------------------------------------------------

class ReferenceSide:
    def __init__(self, job: dict[str, Any], server: Connection, candidate: Connection, workdir: Path):
        self.job = job
        self.config = EvalConfig.from_dict(job["config"])
        self.server = server
        self.candidate = candidate
        self.workdir = workdir
        self.device = _device(job)
        self.smoke = job["smoke"]

    def setup(self) -> None:
        try:
            self.problem = import_problem(self.job, self.workdir)
            init = inputs_mod.init_inputs(self.problem, self.smoke, self.device, self.config.weight_seed)
            self.model = inputs_mod.build_model(self.problem.Model, init, self.device,
                                                self.config.weight_seed)
            first = inputs_mod.make_inputs(self.problem, "main", self.config.seed, self.smoke, self.device)
            with torch.no_grad():
                outputs = transfer.flatten_outputs(self.model(*[_clone(x) for x in first]))
            reference_ops = _op_names(self.model, [_clone(x) for x in first]) if self.config.defences else []
            n_extra = inputs_mod.count_extra_sets(self.problem, self.device) if self.config.extra_inputs else 0
            if self.smoke and hasattr(self.problem, "get_smoke_init_inputs"):
                n_extra = 0  # extra sets fit get_init_inputs(), not the smoke constructor arguments
            flops = None
            if hasattr(self.problem, "get_flops"):
                flops = float(self.problem.get_flops(*first))
        except BaseException as exc:  # a broken problem is the user's error: say where
            channel.send(self.server, {"event": "error", "kind": "bad_problem",
                                       "message": compact_traceback(exc, "problem.py")})
            return
        self.atol = self.config.atol if self.config.atol is not None else getattr(self.problem, "ATOL", None)
        self.rtol = self.config.rtol if self.config.rtol is not None else getattr(self.problem, "RTOL", None)
        _sync(self.device)
        channel.send(self.server, {
            "event": "ready",
            "n_extra": n_extra,
            "alt": bool(self.config.alt_distribution and getattr(self.problem, "ALT_DISTRIBUTION", True)),
            "input_bytes": inputs_mod.tensor_bytes(first),
            "output_bytes": inputs_mod.tensor_bytes(outputs),
            "output_dtype": str(outputs[0].dtype).removeprefix("torch.") if outputs else "float32",
            "flops": flops,
            "param_bytes": _param_bytes(self.model),
            "reference_ops": reference_ops,
        })

    def serve(self) -> None:
        candidate_open = True
        while True:
            ready = wait([self.server] + ([self.candidate] if candidate_open else []))
            if self.candidate in ready:
                try:
                    message, payload = channel.recv(self.candidate)
                except (EOFError, OSError, ValueError):
                    candidate_open = False
                    continue
                if message.get("op") == "check":
                    self.check(message, payload)
            if self.server in ready:
                try:
                    message, _ = channel.recv(self.server)
                except (EOFError, OSError):
                    return
                if message.get("op") == "baselines":
                    self.baselines(message)
                elif message.get("op") == "exit":
                    return

    def check(self, message: dict[str, Any], payload: bytes | None) -> None:
        name = str(message.get("name"))
        kind = str(message.get("kind"))
        seed = int(message.get("seed", 0))
        n_outputs = int(message.get("n_outputs", 0))
        verdict: dict[str, Any] = {"event": "check", "name": name, "kind": kind, "seed": seed}
        try:
            pristine = inputs_mod.make_inputs(self.problem, kind, seed, self.smoke, self.device)
            after_reference = [_clone(x) for x in pristine]
            with torch.no_grad():
                reference = transfer.flatten_outputs(self.model(*after_reference))
            _sync(self.device)
            if kind == "alt" and not all(bool(torch.isfinite(r).all()) for r in reference if r.is_floating_point()):
                verdict.update(passed=True, skipped=True,
                               message="skipped: the reference is not finite on signed normal inputs")
            else:
                received = transfer.unpack(payload or b"", self.device)
                mutation = compare.compare_inputs(after_reference, received[n_outputs:])
                if mutation:
                    verdict.update(passed=False, rejected="input-mutation", message=mutation)
                else:
                    result = compare.compare_outputs(reference, received[:n_outputs], self.atol, self.rtol)
                    verdict.update(passed=result.passed, message=result.message,
                                   max_abs_err=result.max_abs_err, max_rel_err=result.max_rel_err,
                                   rel_l2_err=result.rel_l2_err)
                del received
        except (transfer.pickle.UnpicklingError, ValueError, KeyError, TypeError) as exc:
            verdict.update(passed=False, rejected="bad-payload",
                           message=f"the candidate's process sent a malformed result: {exc}")
        except BaseException as exc:
            verdict.update(passed=False, message="the reference check failed: " + compact_traceback(exc),
                           harness_error=True)
        # The server hears the verdict before the candidate does.
        channel.send(self.server, verdict)
        channel.send(self.candidate, {"passed": bool(verdict["passed"]),
                                      "stop": not verdict["passed"] and not kind.startswith("extra:")})

    def baselines(self, message: dict[str, Any]) -> None:
        out: dict[str, Any] = {"event": "baselines", "timings": {}, "errors": {}}
        if message.get("inductor_dir"):
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(message["inductor_dir"])
        try:
            input_sets = make_timing_sets(self.problem, self.config, self.smoke, self.device)
            timer = make_timer(self.device, self.config, message.get("l2_bytes"))
            runners = {"eager": self.model}
            for mode in message.get("compile_modes", []):
                name = "compile" if mode == "default" else f"compile:{mode}"
                try:
                    runners[name] = torch.compile(self.model, mode=None if mode == "default" else mode)
                except BaseException as exc:
                    out["errors"][name] = compact_traceback(exc)
            for name, runner in runners.items():
                try:
                    with torch.no_grad():
                        runner(*input_sets[0])  # compiles torch.compile's graph, untimed
                    _sync(self.device)
                    report = timer.measure(runner, input_sets, self.config.warmup_ms, self.config.target_ms,
                                           self.config.min_reps, self.config.max_reps,
                                           budget_s=self.config.timeouts.timing)
                    out["timings"][name] = report.timing.__dict__
                except BaseException as exc:
                    out["errors"][name] = compact_traceback(exc)
        except BaseException as exc:
            out["errors"]["setup"] = compact_traceback(exc)
        channel.send(self.server, out)


def _param_bytes(model: Any) -> int:
    if not isinstance(model, torch.nn.Module):
        return 0
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def make_timing_sets(problem: Any, config: EvalConfig, smoke: bool, device: torch.device) -> list[list[Any]]:
    """Rotating input sets for the timed loop, as many as memory comfortably allows."""
    sets = [inputs_mod.make_inputs(problem, "main", config.seed + inputs_mod.SEED_TIMING, smoke, device)]
    per_set = max(inputs_mod.tensor_bytes(sets[0]), 1)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        affordable = int(free * 0.2 // per_set)
    else:
        affordable = int((1 << 30) // per_set)
    for j in range(1, min(config.rotating_input_sets, max(affordable, 1))):
        sets.append(inputs_mod.make_inputs(problem, "main", config.seed + inputs_mod.SEED_TIMING + j,
                                           smoke, device))
    return sets


def make_timer(device: torch.device, config: EvalConfig, l2_bytes: int | None) -> timing.Timer:
    flush = max(2 * (l2_bytes or 0), hardware.DEFAULT_L2_FLUSH_BYTES if not l2_bytes else 0)
    return timing.Timer(device, flush_bytes=flush, flush_l2=config.flush_l2)


def reference_main(job: dict[str, Any], server: Connection, candidate: Connection, workdir: Path,
                   close: list[Connection]) -> None:
    child_setup(workdir / "reference.log", workdir, close)
    side = ReferenceSide(job, server, candidate, workdir)
    side.setup()
    if not hasattr(side, "model"):
        os._exit(0)
    side.serve()
    sys.stdout.flush()
    os._exit(0)


# --------------------------------------------------------------------------------------
# The candidate's process
# --------------------------------------------------------------------------------------

NUMERIC_MODES = {
    "torch.backends.cuda.matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
    "torch.backends.cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
    "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision,
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction":
        lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction":
        lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    "torch.backends.cudnn.benchmark": lambda: torch.backends.cudnn.benchmark,
    "torch.backends.cudnn.deterministic": lambda: torch.backends.cudnn.deterministic,
    "torch.get_default_dtype()": torch.get_default_dtype,
}


def _numeric_modes() -> dict[str, str]:
    out = {}
    for name, read in NUMERIC_MODES.items():
        try:
            out[name] = str(read())
        except Exception as exc:  # noqa: BLE001 - report, never fail on a probe
            out[name] = f"<unreadable: {exc}>"
    return out


class CandidateFailure(Exception):
    def __init__(self, kind: str, stage: str, message: str):
        super().__init__(message)
        self.kind, self.stage, self.message = kind, stage, message


class FreshInputs:
    """Timing inputs as a sequence: item i is a freshly generated input set (its own seed), so
    that no timed iteration sees inputs an earlier call has seen (defeats output caching by
    pointer, shape, identity or content). The timer indexes it like a list of sets.

    Sets are made in batches, as many as a fifth of free device memory holds (at most
    MAX_BATCH): the host enqueues a batch's generators in one go and the device runs them
    back to back, instead of an idle device waiting on the host's Python for every timed
    call. Each set is handed out once and dropped by this object when handed out."""

    MAX_BATCH = 64

    def __init__(self, problem: Any, config: EvalConfig, smoke: bool, device: torch.device):
        self.problem, self.config, self.smoke, self.device = problem, config, smoke, device
        self.last_seed: int | None = None
        self.base = config.seed + inputs_mod.SEED_TIMING + 100
        self.batch: dict[int, list[Any]] = {}
        self.batch_size: int | None = None
        self.generated = 0

    def __len__(self) -> int:
        return 1 << 30

    def _make(self, index: int) -> list[Any]:
        self.generated += 1
        return inputs_mod.make_inputs(self.problem, "main", self.base + index, self.smoke, self.device)

    def _choose_batch_size(self, per_set: int) -> int:
        if self.device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(self.device)
            budget = free * 0.2
        else:
            budget = 1 << 28
        return int(max(1, min(self.MAX_BATCH, budget // max(per_set, 1))))

    def __getitem__(self, index: int) -> list[Any]:
        index = int(index)
        if index not in self.batch:
            self.batch.clear()  # free the unused rest of the last batch before making more
            first = self._make(index)
            if self.batch_size is None:
                self.batch_size = self._choose_batch_size(inputs_mod.tensor_bytes(first))
            self.batch[index] = first
            for j in range(index + 1, index + self.batch_size):
                self.batch[j] = self._make(j)
        self.last_seed = self.base + index
        return self.batch.pop(index)


class _Capture:
    """Calls the model and keeps the latest output with its inputs and seed."""

    def __init__(self, model: Any, sets: FreshInputs):
        self.model, self.sets = model, sets
        self.last: tuple[int | None, tuple, Any] | None = None

    def __call__(self, *args: Any) -> Any:
        out = self.model(*args)
        self.last = (self.sets.last_seed, args, out)
        return out


class CandidateSide:
    def __init__(self, job: dict[str, Any], server: Connection, reference: Connection, workdir: Path):
        self.job = job
        self.config = EvalConfig.from_dict(job["config"])
        self.server = server
        self.reference = reference
        self.workdir = workdir
        self.smoke = job["smoke"]
        self.flags: list[dict[str, Any]] = []
        self.monitor: defences.Monitor | None = None
        self.modes_before: dict[str, str] | None = None
        self.device_share: dict[str, Any] | None = None
        self.poison_bytes = 0
        self.builder: Any = None  # cuda_build.BuildHook for backend "cuda"

    def stage(self, name: str) -> None:
        self.current = name
        channel.send(self.server, {"event": "stage", "stage": name})

    def run(self) -> None:
        self.stage("start")
        self.device = _device(self.job)
        if self.device.type == "cuda":
            torch.empty(1, device=self.device)  # create the context now, not inside "load"
        self.problem = import_problem(self.job, self.workdir)
        # The candidate gets no handle on the problem module through sys.modules.
        sys.modules.pop("kernelagent_problem", None)
        threads_before = {t.ident for t in threading.enumerate()}
        self.modes_before = _numeric_modes()
        if self.config.backend == "cuda":
            from kernelagent.harness import cuda_build

            capability = self.job.get("capability") or ""
            if capability:  # build for this GPU only (faster, and part of the cache key)
                os.environ["TORCH_CUDA_ARCH_LIST"] = capability
            self.builder = cuda_build.BuildHook(self.workdir, self.job.get("cuda_cache_dir"),
                                                self.job.get("candidate_sha256") or "unknown", capability)
            self.builder.install()  # before the audit hook: importing cpp_extension may probe for nvcc
        if self.config.defences:
            self.monitor = defences.Monitor(self.workdir / "candidate.py", self.workdir, self.config,
                                            protected=[self.workdir.parent / "reference"], builder=self.builder)
            self.monitor.install()

        self.stage("load")
        try:
            module = inputs_mod.import_file(self.workdir / "candidate.py", "candidate")
        except BaseException as exc:
            if self.builder is not None and self.builder.last_error:
                raise CandidateFailure("compile_error", "load", self.builder.last_error)
            raise CandidateFailure("compile_error", "load",
                                   "importing the candidate raised:\n" + compact_traceback(exc, "candidate.py"))
        model_cls = getattr(module, "ModelNew", None)
        if not isinstance(model_cls, type):
            raise CandidateFailure("compile_error", "load", "the candidate defines no class ModelNew")
        try:
            init = inputs_mod.init_inputs(self.problem, self.smoke, self.device, self.config.weight_seed)
            self.model = inputs_mod.build_model(model_cls, init, self.device, self.config.weight_seed)
        except BaseException as exc:
            if self.builder is not None and self.builder.last_error:
                raise CandidateFailure("compile_error", "load", self.builder.last_error)
            raise CandidateFailure("compile_error", "load",
                                   "ModelNew(*get_init_inputs()) raised:\n" + compact_traceback(exc, "candidate.py"))
        if self.monitor is not None:
            self.monitor.check_tampering("after import")

        self.stage("compile")
        first = inputs_mod.make_inputs(self.problem, "main", self.config.seed, self.smoke, self.device)
        try:
            with torch.no_grad(), self._watch("first call", first):
                out = self.model(*first)
                _sync(self.device)
        except BaseException as exc:
            if self.builder is not None and self.builder.last_error:
                raise CandidateFailure("compile_error", "compile", self.builder.last_error)
            raise CandidateFailure(_error_kind(exc, "compile_error"), "compile",
                                   "the first forward call raised:\n" + compact_traceback(exc, "candidate.py"))
        try:
            outputs = transfer.flatten_outputs(out)
        except transfer.OutputTypeError as exc:
            raise CandidateFailure("rejected", "compile", str(exc))
        self.poison_bytes = 2 * (inputs_mod.tensor_bytes(outputs) + inputs_mod.tensor_bytes(first)) + (64 << 20)
        del out, first, outputs
        channel.send(self.server, {"event": "compiled"})
        if self.config.compile_only:
            return

        message, _ = channel.recv(self.server)  # the plan of checks, from the server
        if self.monitor is not None:
            self.monitor.set_reference_ops(message.get("reference_ops", []))
        self.stage("correctness")
        for check in message["checks"]:
            if not self.check(check) and check.get("stop_on_failure", True):
                return
        if not message.get("timing"):
            return

        self.stage("timing")
        capture = None
        try:
            if self.config.defences:
                sets: Any = FreshInputs(self.problem, self.config, self.smoke, self.device)
                capture = _Capture(self.model, sets)
                fn: Any = capture
            else:
                sets = make_timing_sets(self.problem, self.config, self.smoke, self.device)
                fn = self.model
            timer = make_timer(self.device, self.config, message.get("l2_bytes"))
            report = timer.measure(fn, sets, self.config.warmup_ms, self.config.target_ms,
                                   self.config.min_reps, self.config.max_reps,
                                   budget_s=self.config.timeouts.timing * 0.6)
            del sets
        except BaseException as exc:
            raise CandidateFailure(_error_kind(exc, "runtime_error"), "timing",
                                   "the timed calls raised:\n" + compact_traceback(exc, "candidate.py"))
        tampered = self.monitor.check_tampering("during timing") if self.monitor is not None else []
        channel.send(self.server, {"event": "timing", "timing": report.timing.__dict__,
                                   "escaped_ms": report.escaped_ms, "tampered": tampered,
                                   "escaped": timing.escaped_work_is_significant(report)})
        if capture is not None and capture.last is not None and message.get("timed_check"):
            self.stage("post-check")
            seed, args, out = capture.last
            capture.last = None
            check = dict(message["timed_check"], seed=seed)
            if not self.send_check(check, list(args), out):
                return
        if message.get("post_check"):
            self.stage("post-check")
            if not self.check(message["post_check"]):
                return
        if self.monitor is not None and self.device.type == "cuda" and self.config.min_own_device_share:
            self.stage("profile")
            values = inputs_mod.make_inputs(self.problem, "main", self.config.seed + inputs_mod.SEED_TIMING,
                                            self.smoke, self.device)
            try:
                self.device_share = defences.device_time_share(self.model, values, self.own_kernel_names(),
                                                               self.device)
            except Exception as exc:  # noqa: BLE001 - the profiler is evidence, not a gate
                self.flags.append({"kind": "profile", "severity": "info",
                                   "message": f"the profiled call failed: {exc}"})
            del values
        if self.config.profile:
            self.stage("profile")
            try:
                kernels = profile_kernels(self.model, self.problem, self.config, self.smoke, self.device,
                                          own_names=self.own_kernel_names())
            except Exception as exc:  # noqa: BLE001 - a profiler failure is not the candidate's verdict
                kernels = []
                self.flags.append({"kind": "profile", "severity": "info", "message": f"torch.profiler failed: {exc}"})
            channel.send(self.server, {"event": "kernels", "kernels": kernels})
        if self.monitor is None:
            new_threads = [t.name for t in threading.enumerate() if t.ident not in threads_before]
            if new_threads:
                self.flags.append({"kind": "threads", "severity": "info",
                                   "message": f"the candidate started threads: {', '.join(new_threads[:5])}"})

    def own_kernel_names(self) -> set[str]:
        """Names of the candidate's own kernels: its Triton kernels that ran, and the
        __global__ functions of its CUDA extensions."""
        names: set[str] = set()
        if self.monitor is not None:
            names |= self.monitor.state.own_names
        if self.builder is not None:
            names |= self.builder.own_names
        return names

    def _watch(self, name: str, values: Any = ()) -> Any:
        if self.monitor is None:
            from contextlib import nullcontext

            return nullcontext()
        return self.monitor.watch(name, values)

    def check(self, check: dict[str, Any]) -> bool:
        kind, seed = check["kind"], int(check["seed"])
        try:
            values = inputs_mod.make_inputs(self.problem, kind, seed, self.smoke, self.device)
            if self.monitor is not None and self.device.type == "cuda":
                defences.poison_cuda_memory(self.device, self.poison_bytes)
            with torch.no_grad(), self._watch(check["name"], values):
                out = self.model(*values)
                _sync(self.device)
        except BaseException as exc:
            raise CandidateFailure(_error_kind(exc, "runtime_error"), self.current,
                                   f"{check['name']} raised:\n" + compact_traceback(exc, "candidate.py"))
        return self.send_check(check, values, out)

    def send_check(self, check: dict[str, Any], values: list[Any], out: Any) -> bool:
        kind, seed = check["kind"], int(check["seed"])
        try:
            outputs = transfer.flatten_outputs(out)
        except transfer.OutputTypeError as exc:
            raise CandidateFailure("rejected", self.current, f"{check['name']}: {exc}")
        aliased = _aliasing(outputs, _tensor_inputs(values))
        if aliased:
            raise CandidateFailure("rejected", self.current, f"{check['name']}: {aliased}")
        use_ipc = self.device.type == "cuda" and self.job.get("ipc", True)
        packed = transfer.pack(outputs + _tensor_inputs(values), use_ipc=use_ipc)
        try:
            channel.send(self.reference, {"op": "check", "name": check["name"], "kind": kind, "seed": seed,
                                          "n_outputs": len(outputs)}, packed.payload)
            reply, _ = channel.recv(self.reference)
        finally:
            transfer.release(packed)
        return not reply.get("stop", False)

    def final_flags(self) -> list[dict[str, Any]]:
        flags = list(self.flags)
        modes_after = _numeric_modes()
        if self.monitor is not None:
            try:
                flags += self.monitor.flags(self.modes_before, modes_after, self.device_share)
            except Exception as exc:  # noqa: BLE001
                flags.append({"kind": "defences", "severity": "info", "message": f"evidence failed: {exc}"})
        elif self.modes_before is not None:
            changed = [f"{k}: {self.modes_before[k]} -> {v}" for k, v in modes_after.items()
                       if self.modes_before.get(k) != v]
            if changed:
                flags.append({"kind": "numeric-modes", "severity": "info",
                              "message": "the candidate changed global numeric modes: " + "; ".join(changed)})
        return flags

    def finish(self) -> None:
        channel.send(self.server, {"event": "done", "flags": self.final_flags()})


def _aliasing(outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> str | None:
    """Outputs must own their memory: one that shares storage with an input is refused."""
    spans = []
    for i, x in enumerate(inputs):
        if x.numel():
            start = x.untyped_storage().data_ptr()
            spans.append((i, start, start + x.untyped_storage().nbytes()))
    for j, y in enumerate(outputs):
        if not y.numel():
            continue
        lo = y.untyped_storage().data_ptr()
        hi = lo + y.untyped_storage().nbytes()
        for i, start, end in spans:
            if lo < end and start < hi:
                return (f"output {j} shares memory with input {i}; return a new tensor "
                        "(outputs may not alias inputs)")
    return None


def _error_kind(exc: BaseException, default: str) -> str:
    text = str(exc).lower()
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text:
        return "out_of_memory"
    if "illegal memory access" in text or "misaligned address" in text or "device-side assert" in text:
        return "cuda_fault"
    return default


def profile_kernels(model: Any, problem: Any, config: EvalConfig, smoke: bool, device: torch.device,
                    top: int = 10, own_names: set[str] | None = None) -> list[dict[str, Any]]:
    """The candidate's top kernels by device time (CPU ops when there is no GPU): name,
    total_ms and calls per forward call, share of the total, and whether it is the
    candidate's own kernel."""
    from kernelagent.harness.cuda_build import is_own_kernel

    from torch.profiler import ProfilerActivity, profile

    values = inputs_mod.make_inputs(problem, "main", config.seed + inputs_mod.SEED_TIMING, smoke, device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.no_grad(), profile(activities=activities) as prof:
        for _ in range(3):
            model(*values)
        _sync(device)
    rows = []
    for event in prof.key_averages():
        if device.type == "cuda":
            total_us = getattr(event, "self_device_time_total", None)
            if total_us is None:
                total_us = getattr(event, "self_cuda_time_total", 0)
            if getattr(event, "device_type", None) is not None and str(event.device_type).endswith("CPU"):
                continue
        else:
            total_us = event.self_cpu_time_total
        if total_us and total_us > 0:
            rows.append({"name": event.key, "total_ms": total_us / 1e3 / 3, "calls": event.count // 3 or 1})
    total = sum(r["total_ms"] for r in rows) or 1.0
    for row in rows:
        row["share"] = row["total_ms"] / total
        row["own"] = is_own_kernel(row["name"], own_names or set())
        row["kind"] = "device" if device.type == "cuda" else "cpu-op"
    rows.sort(key=lambda r: -r["total_ms"])
    return rows[:top]


def candidate_main(job: dict[str, Any], server: Connection, reference: Connection, workdir: Path,
                   close: list[Connection]) -> None:
    child_setup(workdir / "candidate.log", workdir, close)
    side = CandidateSide(job, server, reference, workdir)
    try:
        side.run()
        side.finish()
    except CandidateFailure as failure:
        channel.send(server, {"event": "error", "kind": failure.kind, "stage": failure.stage,
                              "message": failure.message, "flags": side.final_flags()})
    except BaseException as exc:
        channel.send(server, {"event": "error", "kind": _error_kind(exc, "runtime_error"),
                              "stage": getattr(side, "current", "start"),
                              "message": compact_traceback(exc, "candidate.py")})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
