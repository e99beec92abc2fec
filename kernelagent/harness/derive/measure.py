"""What running the problem says (needs torch, imported lazily; the harness calls these in a
forked helper or the reference process, never in its server): a smoke set or a check set that
runs, the sizes on the meta device, and which sizes a CPU evaluation runs at."""

from __future__ import annotations

import math
from collections.abc import Mapping

from kernelagent.harness.derive.rewrite import apply, describe_overrides
from kernelagent.harness.derive.smoke import derive_smoke, smoke_candidates
from kernelagent.harness.derive.source import SMALL_MAIN_BYTES, SMOKE_TARGET_ELEMENTS, Value, input_shapes

def pick_smoke(source: str, target_elements: int = 1 << 16, *,
               max_elements: int = 1 << 20) -> tuple[dict[str, Value], str | None]:
    """The first smoke candidate that runs in-process (validate_smoke), with None; when none
    does, the first candidate and every candidate's error joined, so the caller can report it.
    Needs torch."""
    cands = smoke_candidates(source, target_elements)
    errors = []
    for ov in cands:
        err = validate_smoke(source, ov, max_elements=max_elements)
        if err is None:
            return ov, None
        errors.append(err)
    return cands[0], "; ".join(f"candidate {i + 1}: {e}" for i, e in enumerate(errors))


def _exec_problem(source: str, name: str = "derived_problem"):
    import types

    mod = types.ModuleType(name)
    mod.__dict__["__file__"] = f"<{name}>"
    exec(compile(source, f"<{name}>", "exec"), mod.__dict__)
    return mod


def _tensors(values) -> list:
    import torch

    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(_tensors(v))
    return out


def validate_smoke(source: str, overrides: Mapping[str, Value] | None = None, *,
                   max_elements: int = 1 << 20, seed: int = 0) -> str | None:
    """Run the smoke-overridden problem in this process (CPU): build Model(*get_init_inputs()),
    run it on get_inputs(). None when it runs and every input tensor has at most max_elements
    elements; otherwise one line saying why not. overrides default to derive_smoke(source).
    The sizes are first estimated on the meta device, so a candidate that would allocate more
    than max_elements per input tensor (or 16x that in weights) is refused without allocating."""
    import torch

    try:
        src = apply(source, derive_smoke(source) if overrides is None else overrides)
    except (ValueError, SyntaxError) as e:
        return f"rewrite failed: {e}"
    try:
        est = meta_estimate(src)
    except Exception:  # noqa: BLE001 - the meta device does not run everything: the static estimate
        shapes = input_shapes(src)
        est = {"largest": max((math.prod(s) for s in shapes), default=0) if shapes is not None else None,
               "param_bytes": 0}
    if est["largest"] is not None and est["largest"] > max_elements:
        return f"an input would have {est['largest']} elements (> {max_elements})"
    if est["param_bytes"] > 64 * max_elements:
        return f"the weights would take {est['param_bytes']} bytes (> {64 * max_elements})"
    try:
        torch.manual_seed(seed)
        mod = _exec_problem(src)
        inputs = list(mod.get_inputs())
        for t in _tensors(inputs):
            if t.numel() > max_elements:
                return f"input of shape {tuple(t.shape)} has {t.numel()} elements (> {max_elements})"
        model = mod.Model(*mod.get_init_inputs())
        with torch.no_grad():
            model(*inputs)
    except Exception as e:  # noqa: BLE001 - any failure of the problem itself is the answer
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()
    return None


def validate_variant(source: str, overrides: Mapping[str, Value], *, seed: int = 0) -> str | None:
    """Check one derived check set in-process: get_init_inputs() must return what the original
    returns, the reference must run on the variant's get_inputs(), and the input shapes must
    differ from the main set's. None when all hold; otherwise one line saying which did not."""
    import torch

    try:
        src = apply(source, overrides)
        torch.manual_seed(seed)
        base = _exec_problem(source, "derived_base")
        var = _exec_problem(src, "derived_variant")
        init_a, init_b = list(base.get_init_inputs()), list(var.get_init_inputs())
        if repr(init_a) != repr(init_b):
            return f"init inputs changed: {init_a!r} -> {init_b!r}"
        # Compare shapes statically where possible: the main set's inputs may be many GB.
        main_static, var_static = input_shapes(source), input_shapes(source, overrides)
        inputs = list(var.get_inputs())
        if main_static is not None and var_static is not None:
            main_shapes, shapes = main_static, var_static
        else:
            main_shapes = [tuple(t.shape) for t in _tensors(base.get_inputs())]
            shapes = [tuple(t.shape) for t in _tensors(inputs)]
        if shapes == main_shapes:
            return f"input shapes {shapes} are the main set's"
        model = var.Model(*init_b)
        with torch.no_grad():
            model(*inputs)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()
    return None


def meta_estimate(source: str, overrides: Mapping[str, Value] | None = None) -> dict:
    """What one call of the problem holds, without allocating anything: get_inputs() and
    Model(*get_init_inputs()) run under the meta device, and the forward call too where the
    meta device supports its ops. {"input_bytes", "largest" (elements of the largest input
    tensor), "param_bytes", "output_bytes" (None when the forward call did not run on meta)}.
    Raises whatever the problem raises."""
    import torch

    src = apply(source, overrides) if overrides else source
    with torch.device("meta"):
        mod = _exec_problem(src, "derived_meta")
        inputs = list(mod.get_inputs())
        tensors = _tensors(inputs)
        out = {"input_bytes": sum(t.numel() * t.element_size() for t in tensors),
               "largest": max((t.numel() for t in tensors), default=0), "param_bytes": 0, "output_bytes": None}
        try:
            model = mod.Model(*mod.get_init_inputs())
            if isinstance(model, torch.nn.Module):
                out["param_bytes"] = sum(t.numel() * t.element_size()
                                         for t in list(model.parameters()) + list(model.buffers()))
            with torch.no_grad():
                result = model(*inputs)
            outs = _tensors(result if isinstance(result, (list, tuple)) else [result])
            out["output_bytes"] = sum(t.numel() * t.element_size() for t in outs)
        except Exception:  # noqa: BLE001 - an op without a meta kernel: inputs are what matter most
            pass
    return out


def available_memory() -> int | None:
    """Bytes of host memory available now (MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _need_bytes(est: dict) -> int:
    """Host memory an evaluation at these sizes needs, roughly: in each of its two processes
    the inputs and a copy, the outputs and a copy (the outputs' size is taken to be the inputs'
    where the meta device could not run the call), and the weights."""
    out = est["output_bytes"] if est.get("output_bytes") is not None else est["input_bytes"]
    return 2 * (2 * est["input_bytes"] + 2 * out + est["param_bytes"])


def plan_cpu_inputs(source: str, *, available_bytes: int | None = None, target_elements: int = SMOKE_TARGET_ELEMENTS,
                    max_elements: int = 1 << 20, small_bytes: int = SMALL_MAIN_BYTES) -> dict:
    """Which sizes a CPU evaluation of a problem without get_smoke_inputs() runs at. Runs problem
    code (meta-device estimates, then smoke candidates for real at their small sizes), so call it
    in a process of its own. Returns a JSON-able dict:

    * {"input_set": "main", ...}: the main inputs and weights are small (<= small_bytes), or no
      smoke candidate runs but the main sizes fit available_bytes;
    * {"input_set": "derived-smoke", "overrides": {...}}: the first smoke candidate
      (smoke_candidates) that runs, checked on the meta device first so nothing big is allocated;
    * {"input_set": "too_large", "needed_bytes", "available_bytes"}: none runs and the main sizes
      do not fit.

    Every answer carries "main_bytes" (inputs + weights of the main sizes, None when unknown),
    "needed_bytes" (None when unknown) and "note" (why, in words)."""
    try:
        est = meta_estimate(source)
    except Exception as e:  # noqa: BLE001 - fall back to the static shapes (fp32 assumed)
        shapes = input_shapes(source)
        est = None if shapes is None else {"input_bytes": 4 * sum(math.prod(s) for s in shapes),
                                           "largest": max((math.prod(s) for s in shapes), default=0),
                                           "param_bytes": 0, "output_bytes": None}
        meta_error = f"{type(e).__name__}: {e}"[:300]
    else:
        meta_error = ""
    main_bytes = None if est is None else est["input_bytes"] + est["param_bytes"]
    needed = None if est is None else _need_bytes(est)
    plan = {"main_bytes": main_bytes, "needed_bytes": needed, "available_bytes": available_bytes, "note": ""}
    if main_bytes is not None and main_bytes <= small_bytes:
        return {**plan, "input_set": "main", "note": "the main inputs are small enough for the CPU"}
    errors: list[str] = []
    tried: list[dict] = []
    # The smallest budget first; a larger one when none of its candidates runs (a pooling
    # window that the smallest sizes cannot hold, say), up to 16x.
    for target in (target_elements, 4 * target_elements, 16 * target_elements):
        for ov in smoke_candidates(source, target):
            if ov in tried:
                continue
            tried.append(ov)
            if not ov:
                errors.append(f"candidate {len(tried)}: no size constant to shrink")
                continue
            err = validate_smoke(source, ov, max_elements=max_elements)
            if err is None:
                return {**plan, "input_set": "derived-smoke", "overrides": dict(ov),
                        "note": f"derived smoke sizes: {describe_overrides(source, ov)}"}
            errors.append(f"candidate {len(tried)}: {err}")
    why = "; ".join(errors) or "no smoke candidate"
    if meta_error:
        why += f"; the meta-device estimate failed ({meta_error})"
    if needed is not None and available_bytes is not None and needed > available_bytes:
        return {**plan, "input_set": "too_large",
                "note": f"no smoke sizes could be derived ({why})"}
    return {**plan, "input_set": "main", "note": f"no smoke sizes could be derived ({why}); the main sizes are used"}
