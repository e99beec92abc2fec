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

# Seed offsets for each kind of check, so that no two checks share inputs.
SEED_ALT = 1000
SEED_EXTRA = 2000
SEED_POST_TIMING = 3000
SEED_TIMING = 5000


def import_file(path: Path, module_name: str) -> ModuleType:
    """Import a Python file as a real module (Triton's @jit needs its source on disk)."""
    spec = importlib.util.spec_from_file_location(module_name, str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def init_inputs(problem: ModuleType, smoke: bool, device: torch.device, seed: int) -> list[Any]:
    maker = problem.get_init_inputs
    if smoke and hasattr(problem, "get_smoke_init_inputs"):
        maker = problem.get_smoke_init_inputs
    torch.manual_seed(seed)
    with torch.device(device):
        return list(maker())


def build_model(cls: type, args: list[Any], device: torch.device, weight_seed: int) -> torch.nn.Module:
    """Construct `cls(*args)` with the weight seed, so Model and ModelNew get equal weights."""
    torch.manual_seed(weight_seed)
    with torch.device(device):
        model = cls(*args)
    if isinstance(model, torch.nn.Module):
        model = model.to(device)
    return model


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return value


def count_extra_sets(problem: ModuleType, device: torch.device) -> int:
    if not hasattr(problem, "get_extra_inputs"):
        return 0
    torch.manual_seed(SEED_EXTRA)
    with torch.device(device):
        return len(problem.get_extra_inputs())


def make_inputs(problem: ModuleType, kind: str, seed: int, smoke: bool,
                device: torch.device) -> list[Any]:
    """Inputs for one check. kind: "main", "alt" (signed normal), or "extra:<j>"."""
    torch.manual_seed(seed)
    with torch.device(device):
        if kind.startswith("extra:"):
            inputs = list(problem.get_extra_inputs()[int(kind.split(":", 1)[1])])
        else:
            maker = problem.get_inputs
            if smoke and hasattr(problem, "get_smoke_inputs"):
                maker = problem.get_smoke_inputs
            inputs = list(maker())
            if kind == "alt":
                # Same shapes and dtypes, but signed normal values: a kernel that relies on
                # rand()'s [0, 1) range (ReLU as identity, say) fails here.
                torch.manual_seed(seed)
                inputs = [torch.randn_like(x) if isinstance(x, torch.Tensor) and x.is_floating_point()
                          else x for x in inputs]
    return [_to_device(x, device) for x in inputs]


def tensor_bytes(values: Any) -> int:
    if isinstance(values, torch.Tensor):
        return values.numel() * values.element_size()
    if isinstance(values, (list, tuple)):
        return sum(tensor_bytes(v) for v in values)
    return 0
