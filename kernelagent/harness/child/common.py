"""Helpers shared by the two processes of one job (the reference's and the candidate's),
both forked from the harness server. Nothing here trusts the candidate; the candidate's process
runs this code too, so nothing here may be relied on to hold once candidate code has run there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kernelagent import hardware
from kernelagent.harness.child import inputs as inputs_mod, timing
from kernelagent.harness.child.defences import GLUE_OPS
from kernelagent.harness.jail.fds import close_inherited_fds
from kernelagent.harness.config import EvalConfig

if TYPE_CHECKING:
    from types import ModuleType

def child_setup(log_path: Path, workdir: Path, keep_fds: list[int]) -> None:
    """First thing in a process forked from the server: stdout/stderr to its own log, every other
    inherited descriptor closed, own process group, death with the server, its own working
    directory and caches."""
    log_fd = os.open(str(log_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    # The same closing as the jail's (already done there for the candidate; the reference
    # process gets it here).
    close_inherited_fds(keep_fds)
    if os.getpid() != 1:  # pid 1 of a jail stays in the group of its waiter, which the server signals
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.chdir(workdir)
    os.environ["HOME"] = str(workdir)
    os.environ["TMPDIR"] = str(workdir)
    os.environ["TRITON_CACHE_DIR"] = str(workdir / ".triton")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(workdir / ".inductor")
    # CUDA extensions (backend cuda) build here: one directory per job, so parallel builds
    # never share a build directory or its lock (child/cuda_build.py).
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


def count_devices_through_cuda() -> None:
    """Have torch count the devices through CUDA, never NVML, before its CUDA start-up.

    torch 2.11's lazy CUDA start-up counts the devices with nvmlInit, and beside other jobs
    (several stopped by the timing slot, ncu sessions starting and ending) a job's process could
    spin there past its start limit (docs/concepts/concurrency.md, "No NVML in a job's start").
    Counting through CUDA (cudaGetDeviceCount: the driver we start next anyway) and caching it
    where device_count looks first skips NVML; torch 2.13 counts through CUDA there itself. A
    process already started, or a torch without the cache, is left as it is."""
    import torch.cuda as tcuda

    if not tcuda._is_compiled() or getattr(tcuda, "_initialized", False) or \
            not hasattr(tcuda, "_cached_device_count") or tcuda._cached_device_count is not None:
        return
    count = getattr(torch._C, "_cuda_getDeviceCount", None)
    try:
        found = int(count()) if count is not None else 0
    except Exception:  # noqa: BLE001 - torch's own start-up says what is wrong
        return
    if found > 0:  # none: torch's start-up fails as it would have, with its own words
        tcuda._cached_device_count = found


def job_device(job: dict[str, Any]) -> torch.device:
    clean_numeric_modes()
    device = torch.device(job["device"])
    if device.type == "cuda":
        count_devices_through_cuda()
        torch.cuda.set_device(device)
    return device


def sync_device(device: torch.device) -> None:
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
        module = inputs_mod.import_file(path, "kernelagent_problem")
    else:
        module = types_mod.ModuleType("kernelagent_problem")
        module.__file__ = str(path)
        sys.modules["kernelagent_problem"] = module
        exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - the problem is trusted
    # Derived check sets (server/job.py, harness/derive/): rewritten sources of the problem,
    # imported lazily by inputs.make_inputs for the "extra:<j>" checks.
    derived = job.get("derived_sources") or []
    if derived and not hasattr(module, "get_extra_inputs"):
        setattr(module, inputs_mod.DERIVED_ATTR, inputs_mod.DerivedSets(derived, path))
    return module


def op_names(model: torch.nn.Module, values: list[Any]) -> list[str]:
    """The aten ops (other than views and allocation) that one call of the reference runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class Names(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:  # no torch._dynamo import for it (defences.Recorder)
            import sys

            return "torch._dynamo" in sys.modules

        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            seen.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Names():
        model(*values)
    return sorted(seen - GLUE_OPS)


def tensor_inputs(values: list[Any]) -> list[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor)]


def parameter_bytes(model: object) -> int:
    if not isinstance(model, torch.nn.Module):
        return 0
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def make_timing_sets(problem: ModuleType, seed: int, config: EvalConfig, smoke: bool,
                     device: torch.device, budget_bytes: int | None = None) -> list[list[Any]]:
    """Rotating input sets for timing the baselines, as many as memory comfortably allows."""
    sets = [inputs_mod.make_inputs(problem, "main", seed, smoke, device)]
    per_set = max(inputs_mod.tensor_bytes(sets[0]), 1)
    if budget_bytes is not None:
        affordable = int(budget_bytes // per_set)
    elif device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        affordable = int(free * 0.2 // per_set)
    else:
        affordable = int((1 << 30) // per_set)
    for j in range(1, min(config.rotating_input_sets, max(affordable, 1))):
        sets.append(inputs_mod.make_inputs(problem, "main", seed + j,
                                           smoke, device))
    return sets


class AllocPressure:
    """How often the caching allocator had to give memory back to the device to satisfy an
    allocation (`num_alloc_retries`: the device was full) while timed work ran: the candidate's
    timed segments and profile, the reference's baselines. Beside other jobs that hold device
    memory, such a loop frees and maps memory between its calls, and its times are partly its
    neighbours'; the server re-runs such a job alone (server/job.py conclude_concurrency). A
    guard, not a measured cause (docs/concepts/concurrency.md, "Also re-run alone"). Counted
    around each timed phase only (begin/end, or `with pressure.counting(): ...`)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.retries = 0

    def _read(self) -> int:
        if self.device.type != "cuda":
            return 0
        try:
            return int(torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0))
        except Exception:  # noqa: BLE001 - an allocator without statistics: nothing counted
            return 0

    def begin(self) -> int:
        return self._read()

    def end(self, began: int) -> None:
        self.retries += max(self._read() - began, 0)

    @contextlib.contextmanager
    def counting(self) -> Any:
        began = self.begin()
        try:
            yield
        finally:
            self.end(began)


def make_timer(device: torch.device, config: EvalConfig, l2_bytes: int | None) -> timing.Timer:
    flush = max(2 * (l2_bytes or 0), hardware.DEFAULT_L2_FLUSH_BYTES if not l2_bytes else 0)
    return timing.Timer(device, flush_bytes=flush, flush_l2=config.flush_l2, launch_cover_us=config.launch_cover_us)


def aliasing(outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> str | None:
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


_OOM_WORDS = ("out of memory",) + tuple(word.lower() for word in hardware.ALLOC_FAILED_WORDS)


def error_kind_of(exc: BaseException, default: str) -> str:
    text = str(exc).lower()
    if isinstance(exc, torch.OutOfMemoryError) or any(word in text for word in _OOM_WORDS):
        return "out_of_memory"
    if "illegal memory access" in text or "misaligned address" in text or "device-side assert" in text:
        return "cuda_fault"
    return default
