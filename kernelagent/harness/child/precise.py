"""The reference once more in float64: the yardstick of the comparison's relative L2 rule
(child/compare.py).

Runs only in the reference process, on a copy of the problem's model cast to float64 and on float64
copies of the check's inputs (taken before the reference ran: a model may write its inputs). The
candidate's error is measured against this run and allowed up to a small multiple of the
reference's own error against it (compare.REFERENCE_MULTIPLE), so the tolerance follows the
reference's own rounding: a reduction of 4096 fp32 values gets what its rounding leaves, a
softmax whose rows sum to 1.004 does not.

There is no float64 run (`Precise.outputs` None, `note` says why; the comparison then keeps the
rules without it, compare.FALLBACK_L2) where it would not mean anything or costs too much:
  - the reference's outputs are float64 already, or none of them is floating/complex;
  - the reference draws random numbers (an op tagged nondeterministic_seeded: dropout, rand);
  - the float64 run computes in a dtype not FINER times finer than the reference's outputs anyway
    (an explicit .float() inside an fp32 model: its "high-precision" output would be as rounded
    as the reference's; float32 inside a bf16 model is fine);
  - it does not run in float64 (a dtype error), or its outputs differ in count or shape;
  - the model, its inputs and outputs in float64 would take more than half of the memory free
    (the device's, or the host's on the CPU), or the device runs out of memory during it;
  - a previous float64 run in this process took longer than MAX_SECONDS (every later check
    of the evaluation then keeps the rules without it), or the reference's own call is slower
    than MAX_REFERENCE_MS on a GPU.
The random number generators' states are saved before the run and restored after it, so the
checks' inputs and the reference's own draws are what they were without it.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kernelagent.harness.derive.measure import available_memory

# A float64 run slower than this (seconds) is not made again in this process.
MAX_SECONDS = 10.0
# On a GPU, a reference call slower than this (ms) gets no float64 run (a GPU's float64 units
# can be 2-64x slower than its float32 ones; the checks share the correctness stage's limit).
MAX_REFERENCE_MS = 200.0
# The share of the free memory (device, or host on the CPU) a float64 run may plan to take.
MEMORY_SHARE = 0.5
# On a GPU at most this much (bytes), whatever is free: the server's memory ledger plans each job's
# device memory from its problem's own tensors, not a float64 copy of them, and jobs beside this
# one take what is free now (an H200 run of 8 jobs of 12-14 GiB problems ran out of memory in the
# candidates' processes with an uncapped run). Past it the check says so and keeps the bounded rule.
MAX_DEVICE_BYTES = 2 << 30
# Neighbours drawn on a second look (compare.py): more realisations of the reference's own error.
NEIGHBOURS = 3

# The float64 run is a yardstick where what it computes in is at least this many times finer
# (machine epsilon) than every output of the reference it judges: float32 kept inside a bf16 or
# fp16 model (an RMSNorm's x.float()) is, inside an fp32 model it is not.
FINER = 256.0


def _eps(dtype: torch.dtype) -> float:
    real = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}
    return float(torch.finfo(real.get(dtype, dtype)).eps)


@dataclass
class Precise:
    """The float64 outputs (None where there is no run; `note` says why), in the reference's
    order (None for an output that is not floating or complex), and `neighbours`: a callable that
    runs the reference and its float64 copy on NEIGHBOURS inputs one ulp away from the check's,
    and returns, per run, each output's relative L2 error of the reference against its float64
    run (None for outputs not compared that way)."""

    outputs: list[torch.Tensor | None] | None
    note: str = ""
    neighbours: Callable[[], list[list[float | None]]] | None = field(default=None, repr=False)


def _wide(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            return value.to(torch.complex128)
        if value.is_floating_point():
            return value.to(torch.float64)
    return value


def wide_copies(values: list[Any]) -> list[Any]:
    """float64 (complex128) copies of the floating (complex) tensors, the rest as they are."""
    return [_wide(v) for v in values]


def _rng_state(device: torch.device) -> tuple[Any, Any]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.random.get_rng_state(), cuda


def _set_rng_state(state: tuple[Any, Any], device: torch.device) -> None:
    torch.random.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


class _NotMeaningful(Exception):
    pass


def _guarded_run(model: torch.nn.Module, values: list[Any], finest: float) -> list[torch.Tensor]:
    """One call of the float64 model, every op watched: a random op, or an op's output in a float
    dtype whose epsilon is over `finest` / FINER (finest: the epsilon of the most precise output
    judged), means the run is no yardstick (_NotMeaningful)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from kernelagent.harness.child import transfer

    problems: list[str] = []

    class Watch(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:  # as common.op_names: no torch._dynamo import for it
            import sys

            return "torch._dynamo" in sys.modules

        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
                problems.append(f"the reference draws random numbers ({func.overloadpacket.__name__})")
            result = func(*args, **(kwargs or {}))
            if not problems:
                for t in tree_flatten(result)[0]:
                    if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) \
                            and _eps(t.dtype) * FINER > finest:
                        problems.append(f"the reference computes in {str(t.dtype).removeprefix('torch.')} "
                                        f"inside ({func.overloadpacket.__name__}) even in float64")
                        break
            return result

    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # tensors the model makes itself (torch.zeros(n))
    try:
        with torch.no_grad(), Watch():
            outputs = transfer.flatten_outputs(model(*values))
    finally:
        torch.set_default_dtype(default)
    if problems:
        raise _NotMeaningful(problems[0])
    return outputs


def _allowed_bytes(device: torch.device) -> float:
    """What a float64 run may plan to take: MEMORY_SHARE of the free memory, at most
    MAX_DEVICE_BYTES on a GPU."""
    allowed = MEMORY_SHARE * _available_bytes(device)
    return min(allowed, MAX_DEVICE_BYTES) if device.type == "cuda" else allowed


def _available_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    host = available_memory()
    return host if host is not None else 1 << 62


def _bytes(values: Any) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


class HighPrecision:
    """The reference process's float64 runs: one `run` per check (see the module's docstring)."""

    def __init__(self, model: torch.nn.Module, device: torch.device, estimate_ms: float = 0.0):
        self.model = model
        self.device = device
        self.off = ""  # set once a run took too long: every later check goes without
        self.note = ""  # why the last copies() made none
        if device.type == "cuda" and estimate_ms > MAX_REFERENCE_MS:
            self.off = (f"no float64 run: the reference's call takes {estimate_ms:.0f} ms on the device "
                        f"(over {MAX_REFERENCE_MS:.0f} ms)")

    @property
    def active(self) -> bool:
        return not self.off and isinstance(self.model, torch.nn.Module)

    def copies(self, values: list[Any]) -> list[Any] | None:
        """wide_copies of a check's inputs, or None (self.note says why) where they would take
        more than MEMORY_SHARE of the free memory or do not fit."""
        self.note = ""
        if not self.active:
            self.note = self.off or "no float64 run: the problem's model is not a torch.nn.Module"
            return None
        need = sum(_wide(v).element_size() * v.numel() for v in values if isinstance(v, torch.Tensor))
        allowed = _allowed_bytes(self.device)
        if need > allowed:
            self.note = (f"no float64 run: its inputs alone would take {need / 2**30:.2f} GiB where "
                         f"{allowed / 2**30:.2f} GiB may be planned")
            return None
        try:
            return wide_copies(values)
        except torch.OutOfMemoryError:
            self._release()
            self.note = "no float64 run: copying the inputs to float64 ran out of memory"
            return None

    def wanted(self, reference: list[torch.Tensor]) -> str:
        """"" when a float64 run of these outputs means something, else why not."""
        if self.off:
            return self.off
        if not isinstance(self.model, torch.nn.Module):
            return "no float64 run: the problem's model is not a torch.nn.Module"
        compared = [r for r in reference if r.is_floating_point() or r.is_complex()]
        if not compared:
            return ""  # integer outputs only: compared exactly, no yardstick needed
        if all(r.dtype in (torch.float64, torch.complex128) for r in compared):
            return "no float64 run: the reference's outputs are float64 already"
        return ""

    def run(self, wide_inputs: list[Any] | None, reference: list[torch.Tensor],
            regenerate: Callable[[], list[Any]] | None = None) -> Precise:
        """The float64 run on `wide_inputs` (wide_copies of the check's inputs, taken before the
        reference ran). `regenerate` makes the check's inputs again (for the neighbours)."""
        why = self.wanted(reference)
        if why or wide_inputs is None:
            return Precise(None, why or getattr(self, "note", "") or "no float64 run")
        if not any(r.is_floating_point() or r.is_complex() for r in reference):
            return Precise(None, "")
        # The float64 copy of the model beside the model's own copy being made, the float64 inputs,
        # and the float64 outputs twice (the run's, and the comparison's temporaries).
        params = list(self.model.parameters()) + list(self.model.buffers())
        need = 2 * sum(p.numel() * _wide(p).element_size() for p in params) + _bytes(wide_inputs) \
            + 2 * sum(_wide(r).numel() * _wide(r).element_size() for r in reference)
        allowed = _allowed_bytes(self.device)
        if need > allowed:
            return Precise(None, f"no float64 run: it would take about {need / 2**30:.2f} GiB where "
                                 f"{allowed / 2**30:.2f} GiB may be planned")
        state = _rng_state(self.device)
        started = time.perf_counter()
        try:
            outputs = _guarded_run(self._wide_model(), wide_inputs, self._finest(reference))
        except _NotMeaningful as exc:
            return Precise(None, f"no float64 run: {exc}")
        except torch.OutOfMemoryError:
            outputs = None
            self._release()
            return Precise(None, "no float64 run: it ran out of memory")
        except Exception as exc:  # noqa: BLE001 - the model does not run in float64: no yardstick
            line = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            return Precise(None, f"no float64 run: the reference does not run in float64 ({type(exc).__name__}: "
                                 f"{line})")
        finally:
            _set_rng_state(state, self.device)
        seconds = time.perf_counter() - started
        if seconds > MAX_SECONDS:
            self.off = f"no float64 run: one took {seconds:.1f} s (over {MAX_SECONDS:.0f} s)"
        if len(outputs) != len(reference) or any(tuple(o.shape) != tuple(r.shape)
                                                 for o, r in zip(outputs, reference)):
            return Precise(None, "no float64 run: its outputs differ in count or shape from the reference's")
        kept: list[torch.Tensor | None] = []
        for o, r in zip(outputs, reference):
            kept.append(_wide(o) if (r.is_floating_point() or r.is_complex()) and
                        (o.is_floating_point() or o.is_complex()) else None)
        neighbours = None
        if regenerate is not None:
            def neighbours() -> list[list[float | None]]:
                return self._neighbours(regenerate)
        return Precise(kept, "", neighbours)

    @staticmethod
    def _finest(reference: list[torch.Tensor]) -> float:
        return min([_eps(r.dtype) for r in reference if r.is_floating_point() or r.is_complex()] or [1.0])

    def _wide_model(self) -> torch.nn.Module:
        """A float64 copy of the model as it is now (a stateful model's buffers included)."""
        # (Module.to(torch.float64) would cast complex parameters to float64, dropping their
        # imaginary parts: each tensor goes through _wide instead.)
        return copy.deepcopy(self.model)._apply(_wide)

    def _neighbours(self, regenerate: Callable[[], list[Any]]) -> list[list[float | None]]:
        """The reference and its float64 copy on NEIGHBOURS inputs, each floating input moved one
        ulp up or down at random: fresh realisations of the reference's own rounding (one
        realisation can be near zero by chance where few elements make the output's norm)."""
        from kernelagent.harness.child import transfer

        errors: list[list[float | None]] = []
        state = _rng_state(self.device)
        try:
            wide_model = self._wide_model()
            for n in range(NEIGHBOURS):
                values = regenerate()
                moved = []
                for i, v in enumerate(values):
                    if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel():
                        gen = torch.Generator(device=v.device).manual_seed(0x5EED + 101 * n + i)
                        up = torch.rand(v.shape, generator=gen, device=v.device, dtype=torch.float32) < 0.5
                        v = torch.nextafter(v, torch.where(up, float("inf"), float("-inf")).to(v.dtype))
                    moved.append(v)
                wide = wide_copies(moved)
                with torch.no_grad():
                    reference = transfer.flatten_outputs(self.model(*moved))
                high = _guarded_run(wide_model, wide, self._finest(reference))
                errors.append([_rel_l2(r, h) for r, h in zip(reference, high)])
                del values, moved, wide, reference, high
        except Exception:  # noqa: BLE001 - out of memory, or else: the realisations so far count
            self._release()
        finally:
            _set_rng_state(state, self.device)
        return errors

    def _release(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _rel_l2(reference: torch.Tensor, high: torch.Tensor) -> float | None:
    if not (reference.is_floating_point() or reference.is_complex()) or tuple(reference.shape) != tuple(high.shape):
        return None
    r = _wide(reference)
    h = _wide(high)
    if r.is_complex():
        r, h = torch.view_as_real(r), torch.view_as_real(h.to(torch.complex128))
    finite = torch.isfinite(r) & torch.isfinite(h)
    r, h = torch.where(finite, r, 0), torch.where(finite, h, 0)
    norm = float(torch.linalg.vector_norm(h))
    return float(torch.linalg.vector_norm(r - h)) / norm if norm > 0 else 0.0
