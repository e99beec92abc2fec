"""Loading a problem module and making its inputs, identically in every process.

The reference process and the candidate's process both call these with the same seeds, so
they build the same weights and inputs on the device without copying anything between them.
Inputs are generated directly on the device (under a default-device context): for multi-GB
problems that is the difference between milliseconds and a minute per trial.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kernelagent.harness.child import special

# The seed the reference validates derived sets with (their outputs never leave it). Every check's
# own seed is the server's, keyed by the evaluation's secret (server/draws.py).
SEED_EXTRA = 2000


def import_file(path: Path, module_name: str) -> ModuleType:
    """Import a Python file as a real module (Triton's @jit needs its source on disk)."""
    spec = importlib.util.spec_from_file_location(module_name, str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def seed_generators(seed: int) -> None:
    """torch.manual_seed's effect on the generators inputs come from (the CPU's, and CUDA's once
    initialised), without its cost. torch.manual_seed also queues a lazy seeding for every
    backend not initialised (XPU and MTIA on a CUDA machine, CUDA too on a CPU one), each with
    a traceback.format_stack() of the caller: dozens of frame reads per call, which the
    candidate's audit hook sees one by one. In the timed loop, which seeds every input set,
    that cost ran in the candidate's process (0.1 ms per call on the CPU) and not in the
    reference's calibration, and so read as candidate time on the server's clock."""
    torch.random.default_generator.manual_seed(seed)
    # Immediate once CUDA is initialised; before that (rare here) CUDA's own lazy seeding.
    if torch.cuda.is_initialized() or torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def init_inputs(problem: ModuleType, smoke: bool, device: torch.device, seed: int) -> list[Any]:
    maker = problem.get_init_inputs
    if smoke and hasattr(problem, "get_smoke_init_inputs"):
        maker = problem.get_smoke_init_inputs
    seed_generators(seed)
    with torch.device(device):
        return list(maker())


def build_model(cls: type, args: list[Any], device: torch.device, weight_seed: int) -> torch.nn.Module:
    """Construct `cls(*args)` with the weight seed, so Model and ModelNew get equal weights."""
    seed_generators(weight_seed)
    with torch.device(device):
        model = cls(*args)
    if isinstance(model, torch.nn.Module):
        model = model.to(device)
    return model


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return value


DERIVED_ATTR = "__kernelagent_derived_sets__"


class DerivedSets:
    """The derived check sets of a problem without get_extra_inputs(): one rewritten problem
    source per set (server/draws.py). Each is imported once per process, when its check first
    runs, as a module of its own; only its get_inputs() is used (the model always comes from
    the main problem: a derived set never changes a constant the model's construction reads).
    The reference has every set from the start; the candidate's process gets each one with its
    own check (`add`), so it never knows a derived shape before that check runs."""

    def __init__(self, sources: list[str], path: Path):
        self.sources = dict(enumerate(sources))
        self.path = path
        self.modules: dict[int, ModuleType] = {}

    def __len__(self) -> int:
        return len(self.sources)

    def add(self, j: int, source: str) -> None:
        if self.sources.get(j) != source:
            self.sources[j] = source
            self.modules.pop(j, None)

    def module(self, j: int) -> ModuleType:
        if j not in self.modules:
            name = f"kernelagent_problem_derived_{j}"
            module = ModuleType(name)
            module.__file__ = str(self.path)
            exec(compile(self.sources[j], str(self.path), "exec"), module.__dict__)  # noqa: S102
            self.modules[j] = module
        return self.modules[j]


def add_derived_set(problem: ModuleType, j: int, source: str, path: Path) -> None:
    """The candidate's process: derived set j's source, handed over with its own check."""
    sets = getattr(problem, DERIVED_ATTR, None)
    if sets is None:
        sets = DerivedSets([], path)
        setattr(problem, DERIVED_ATTR, sets)
    sets.add(j, source)


def count_extra_sets(problem: ModuleType, device: torch.device) -> int:
    if not hasattr(problem, "get_extra_inputs"):
        return len(getattr(problem, DERIVED_ATTR, ()))
    seed_generators(SEED_EXTRA)
    with torch.device(device):
        return len(problem.get_extra_inputs())


def make_inputs(problem: ModuleType, kind: str, seed: int, smoke: bool,
                device: torch.device) -> list[Any]:
    """Inputs for one check. kind: "main", "alt" (lines of signed normal values mixed in),
    "near-one" (lines of values within 5% of one mixed in), or "extra:<j>"."""
    seed_generators(seed)
    with torch.device(device):
        if kind.startswith("extra:") and not hasattr(problem, "get_extra_inputs") and hasattr(problem, DERIVED_ATTR):
            inputs = list(getattr(problem, DERIVED_ATTR).module(int(kind.split(":", 1)[1])).get_inputs())
        elif kind.startswith("extra:"):
            inputs = list(problem.get_extra_inputs()[int(kind.split(":", 1)[1])])
        else:
            maker = problem.get_inputs
            if smoke and hasattr(problem, "get_smoke_inputs"):
                maker = problem.get_smoke_inputs
            inputs = list(maker())
            if kind in special.SPECIAL_KINDS:
                # The problem's own inputs with special values in lines drawn from the seed
                # (child/special.py): signed normal ones (a kernel that relies on rand()'s [0, 1)
                # range, ReLU as identity, fails) or ones near one (products and scans keep those
                # lines' outputs significant, where a cumprod of rand() decays below any tolerance).
                inputs = special.mix(inputs, kind, seed)
    return [_to_device(x, device) for x in inputs]


class FreshInputs:
    """Input sets as a sequence: item i is a freshly generated set (seed `base + i`), so that no
    call sees inputs an earlier call has seen (defeats output caching by pointer, shape, identity
    or content). The timed loop indexes it like a list of sets.

    Sets are made in batches, as many as a fifth of free device memory holds (at most
    MAX_BATCH): the host enqueues a batch's generators in one go and the device runs them back to
    back, instead of idling on the host's Python for every call. Each set is handed out once and
    dropped when handed out. The reference process uses the same class for the calibration loop,
    so both loops generate alike."""

    MAX_BATCH = 64

    def __init__(self, problem: ModuleType, base_seed: int, smoke: bool, device: torch.device,
                 budget_bytes: int | None = None):
        self.problem, self.smoke, self.device = problem, smoke, device
        self.base = base_seed
        self.budget_bytes = budget_bytes
        self.batch: dict[int, list[Any]] = {}
        self.batch_size: int | None = None
        self.generated = 0

    def __len__(self) -> int:
        return 1 << 30

    def _make(self, index: int) -> list[Any]:
        self.generated += 1
        return make_inputs(self.problem, "main", self.base + index, self.smoke, self.device)

    def _choose_batch_size(self, per_set: int) -> int:
        if self.budget_bytes is not None:
            budget = self.budget_bytes
        elif self.device.type == "cuda":
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
                self.batch_size = self._choose_batch_size(tensor_bytes(first))
            self.batch[index] = first
            for j in range(index + 1, index + self.batch_size):
                self.batch[j] = self._make(j)
        return self.batch.pop(index)


def tensor_bytes(values: Any) -> int:
    if isinstance(values, torch.Tensor):
        return values.numel() * values.element_size()
    if isinstance(values, (list, tuple)):
        return sum(tensor_bytes(v) for v in values)
    return 0
