"""Special values mixed into the problem's own inputs (issue 54, class 4): the checks on signed
normal values ("alt") and on values near one ("near-one") are no longer sets of those values
alone, which a kernel recognised from a statistic of its input (``(x - 1).abs().max() < 0.1``)
and computed in full only there. Each floating input of such a check is the problem's own
(get_inputs() with the check's seed), with the special values written over a minority of it:

* a tensor with two or more dims of size > 1: whole LINES along each such axis (every element
  that shares the other indices), each line chosen with a probability drawn per check so that
  about a quarter to a half of the elements are special, at least one line per axis and never
  all of them. A product, scan or reduction along any axis then meets lines that are special
  from end to end (their outputs stay significant: the check keeps its power), beside lines of
  the problem's own distribution (a statistic of the whole input looks ordinary);
* a tensor with one dim of size > 1: a prefix or a suffix (drawn) of a quarter to a half of it,
  so that a scan from either end starts in the special values.

Positions and values come from the check's seed, which the server draws from the evaluation's
secret (server/draws.py) and reveals only when the check runs; both processes make them alike.
Tensors of one element, integer and complex ones are left as they are."""

from __future__ import annotations

import math
import random
from typing import Any

import torch

SPECIAL_KINDS = ("alt", "near-one")
FRACTION = (0.25, 0.5)  # of a tensor's elements that carry the special values, drawn per check


def special_values(kind: str, count: int, like: torch.Tensor) -> torch.Tensor:
    if kind == "alt":
        return torch.randn(count, dtype=like.dtype)
    return 1.0 + 0.05 * (2.0 * torch.rand(count, dtype=like.dtype) - 1.0)


def mix(inputs: list[Any], kind: str, seed: int) -> list[Any]:
    """`inputs` (the problem's own, made under the current default device) with `kind`'s special
    values mixed in (module doc). Called right after get_inputs(): the torch generators go on
    from where get_inputs() left them, in both processes alike."""
    draw = random.Random(seed)
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 1:
            x = _mix_one(x, kind, draw)
        out.append(x)
    return out


def _mix_one(x: torch.Tensor, kind: str, draw: random.Random) -> torch.Tensor:
    out = x.clone()  # never the problem's own tensor (a module-level one would keep the values)
    dims = [a for a, n in enumerate(x.shape) if n > 1]
    fraction = draw.uniform(*FRACTION)
    if len(dims) == 1:
        axis, n = dims[0], x.shape[dims[0]]
        length = min(n - 1, max(1, round(fraction * n)))
        start = 0 if draw.random() < 0.5 else n - length
        part = out.narrow(axis, start, length)
        part.copy_(special_values(kind, part.numel(), x).view(part.shape))
        return out
    p = 1.0 - (1.0 - fraction) ** (1.0 / len(dims))
    masks = []
    for axis in dims:
        sub = list(x.shape)
        sub[axis] = 1
        mask = torch.rand(sub) < p
        if not bool(mask.any()):
            mask.view(-1)[draw.randrange(mask.numel())] = True
        masks.append(mask)
    for i, mask in enumerate(masks):
        if bool(mask.all()):  # every line of an axis: the whole tensor would be special
            # One line of that axis instead; the other axes keep theirs (the whole set of masks
            # used to give way to one line of the first axis, leaving no line along the others: a
            # 4-row cumprod then had no special row in 0.3% of seeds, and a kernel that computes
            # in full only near one passed).
            masks[i] = torch.zeros_like(mask)
            masks[i].view(-1)[draw.randrange(mask.numel())] = True
    for mask in masks:
        full = mask.expand(x.shape)
        count = int(mask.sum()) * math.prod(x.shape) // mask.numel()
        out.masked_scatter_(full, special_values(kind, count, x))
    return out
