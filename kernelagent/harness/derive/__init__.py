"""Derived input sets for problems that bring none (KernelBench): rewrite a problem's module-level
size constants.

By concern: source.py reads the source (constants, shapes), variants.py derives the check sets,
smoke.py the smoke candidates, rewrite.py writes overrides into the source, measure.py runs the
problem (validation, meta-device estimates, the CPU plan; torch imported lazily). This face
keeps `from kernelagent.harness import derive` and every name below where it was.

KernelBench problem files set their sizes as module-level constants (``batch_size = 4096``,
``N = 2048 * 2``, ``height = width = 128``, ``D, H, W = 16, 32, 32``, ``input_shape = (32768,)``)
that ``get_inputs()`` and ``get_init_inputs()`` read. They have no ``get_extra_inputs()`` (so a
kernel with its shape baked in passes) and no ``get_smoke_inputs()`` (so CPU mode would allocate
the full multi-GB inputs). This module works on the problem's SOURCE TEXT only — it never imports
torch or runs the problem, except in the ``validate_*`` helpers, :func:`meta_estimate` and
:func:`plan_cpu_inputs`, which import torch lazily (the harness calls them in a forked helper or
the reference process, never in its server) — and returns override dicts plus :func:`apply`,
which rewrites the source with them.

Where the harness uses it (server/job.py): on the CPU, :func:`plan_cpu_inputs` picks the sizes a
problem without get_smoke_inputs() runs at ("derived-smoke"), or says it is too large; for a
problem without get_extra_inputs(), :func:`derive_check_variants` gives the derived check sets,
which the reference validates before they are checked.

Vocabulary and rules (all deterministic; the same source always gives the same answer, except the
check variants' values where the caller passes a generator: the harness draws them per evaluation
from its secret seed, server/draws.py, so that they cannot be computed from the source ahead):

* **Size constant** (:func:`size_constants`): a module-level name assigned exactly once, from a
  pure integer literal expression (``4096``, ``2048 * 2``, chained or tuple-unpacked targets),
  whose value is a positive int (bools excluded) and whose name is not a hyper-parameter: no
  ``_``-separated token of the name starts with one of :data:`HYPER_TOKENS` (kernel, stride, pad,
  dilation, pool, scale, factor, ...). Names bound to other names (``groups = in_channels``) are
  not constants: they follow their source. **Sequence constants** (:func:`sequence_constants`)
  are the same for a tuple/list of positive int literals (``input_shape = (32768,)``,
  ``layer_sizes = [16384, 16384]``); overrides give them a tuple/list of the same kind.
* **Shape names**: constants that reach a shape position of a tensor factory call in
  ``get_inputs()`` (``torch.rand/randn/zeros/ones/empty(*dims)``, the ``size`` of
  ``torch.randint/full``), directly or through other module-level names.
* **Pinned** (:func:`pinned_constants`): constants read by ``get_init_inputs()`` or by any class or
  function other than ``get_inputs`` (the model's construction may read globals), directly or
  through other module-level names. Changing one changes the model, so check variants never do.
* **Check variants** (:func:`derive_check_variants`): only non-pinned shape names with a value >= 3
  change (1 and 2 are usually broadcast dims or axes). Variant 1 halves each one and makes it odd
  (``max(3, (v // 2) | 1)``): smaller, ragged tails. Variant 2 grows each a little, by a step
  that cycles over 2, 4, 6 in source order, and makes it odd: larger than the main set, so a
  grid or mask sized for the main shape leaves elements unwritten (on the smaller sets such a
  kernel writes past its outputs' end, which often fails nothing), and dims that were equal or
  in a fixed ratio no longer are (a kernel that assumes M == N fails).
  Variant 3 (asked for with n >= 3) scales each by a ratio that cycles over 3/4, 5/8, 7/8 and
  makes it odd. Variant 4 keeps divisibility: ``v - 2**k`` with 2**k the largest power of two
  dividing v that is <= v/4 (a fallback when odd sizes break a divisibility the problem needs).
  Variant 5 halves (odd) only the constants used solely as the leading (batch) dim, for models
  that tie their other dims together. Further variants cycle the ratios differently. Every
  variant differs from the main set; only variant 2 is larger than it (by a few elements per
  dim: about the main set's bytes). If a problem has nothing to vary the list is empty. **The caller must
  validate** each variant by running the reference on it (with the main set's init inputs) and
  drop those that fail: these rules do not know every constraint a model has
  (:func:`validate_variant` does it in-process).
  With ``rng`` (a ``random.Random``), each variant keeps its rule but draws its values within a
  band (one draw per distinct main value, so equal dims stay equal, except in variant 2): variant
  1 an odd value in [v/4, 3v/4]; variant 2 ``(v + step) | 1`` with an even step of up to
  ``max(6, v/64)``, distinct for slots of equal value; variant 3 and further a ratio drawn in
  [9/16, 15/16]; variant 4 ``v - m * 2**k`` with m in 1..3 (kept >= v/4); variant 5 the batch
  draw of variant 1.
* **Smoke** (:func:`smoke_candidates`, :func:`derive_smoke` = the first, :func:`pick_smoke` = the
  first that runs). A size slot is a scalar size constant or an element of a sequence constant,
  pinned ones included; the budget is ``target_elements`` per tensor that ``get_inputs()`` builds,
  estimated statically from the shapes. Three candidates, in this order:
  1. *common power of two*: every slot above :data:`SMOKE_FLOOR` is divided by the same ``2**k``
     (smallest k that meets the budget), never below the floor, then rounded up to a multiple of
     ``gcd(v, 8)`` and of the new value of every group-like constant (a name token starting with
     group/head/cluster/patch/window) that divided it. Ratios, equalities (a LayerNorm over
     ``out_channels`` applied to ``2 * W``) and divisibility (``channels % num_groups``,
     ``% 4`` asserts) survive.
  2. *common cap*: every slot becomes ``min(v, cap)`` with the largest cap >= SMOKE_FLOOR that
     meets the budget (the floor when none does), a multiple of the group-like divisors as above,
     else odd when that costs 1. Small dims stay; all large dims come down to about the same size,
     which keeps deep pooling stacks alive.
  3. *batch only*: constants used solely as the leading dim of the inputs become ``min(v, 2)``,
     for models whose construction fixes the other sizes (an image size default).
  Candidates that meet the budget statically come first (stable). Ranks never change. Literal
  dims in ``get_inputs()`` (``224``) cannot shrink, so a budget may be unreachable.
  :func:`validate_smoke` runs one candidate in-process and says why it fails, if it does.

:func:`apply` rewrites only the assignments it has to, through the AST's byte offsets, and keeps
every other byte; a chained assignment whose names get different values is split into
``a = 1; b = 2`` on the same line.
"""

from __future__ import annotations

from kernelagent.harness.derive.measure import (available_memory, meta_estimate, pick_smoke, plan_cpu_inputs,
                                               validate_smoke, validate_variant)
from kernelagent.harness.derive.rewrite import apply, describe_overrides
from kernelagent.harness.derive.smoke import derive_smoke, smoke_candidates
from kernelagent.harness.derive.source import (HYPER_TOKENS, SMALL_MAIN_BYTES, SMOKE_FLOOR, SMOKE_TARGET_ELEMENTS, Module,
                                              Value, input_shapes, pinned_constants, sequence_constants,
                                              shape_names, size_constants)
from kernelagent.harness.derive.variants import derive_check_variants

__all__ = [
    "HYPER_TOKENS", "SMOKE_FLOOR", "size_constants", "sequence_constants", "pinned_constants",
    "shape_names", "input_shapes", "derive_check_variants", "smoke_candidates", "derive_smoke",
    "pick_smoke", "apply", "validate_smoke", "validate_variant", "meta_estimate", "plan_cpu_inputs",
    "available_memory", "describe_overrides", "SMALL_MAIN_BYTES", "SMOKE_TARGET_ELEMENTS", "Value", "Module",
]
