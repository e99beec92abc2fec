"""Trusted comparison of a candidate's outputs against the reference.

Runs only in the reference process. An output passes when
  - its shape, dtype and device type match the reference's,
  - it is non-finite exactly where the reference is,
  - every element satisfies |out - ref| <= max(atol, rtol * RMS(ref)) + rtol * |ref|, and
  - its relative L2 error ||out - ref|| / ||ref|| is at most max(rtol, L2_FLOOR).
The last rule scales with the output's magnitude: a softmax over 400k columns has values
near 2.5e-6, so an all-zero output passes an atol of 1e-4 elementwise but has a relative
L2 error of 1. It judges gross errors that atol hides, not rounding: where ReLU leaves only a few
small outputs that are what is left of a subtraction of large values, an honest fp32 kernel's
rounding (about eps times the large values) is 1e-4 of the output or more (KernelBench's
level2/9 on signed-normal inputs at its derived CPU size: 1.3e-4, once judged incorrect).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelagent.harness.config import tolerance_for


@dataclass
class Comparison:
    passed: bool
    message: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    rel_l2_err: float | None = None


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def _index(flat_index: int, shape: tuple[int, ...]) -> list[int]:
    index = []
    for size in reversed(shape):
        index.append(flat_index % size if size else 0)
        flat_index = flat_index // size if size else 0
    return list(reversed(index))


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def compare_outputs(reference: list[torch.Tensor], received: list[dict], atol: float | None,
                    rtol: float | None) -> Comparison:
    """Compare outputs received from the candidate (see transfer.unpack) with `reference`."""
    if len(received) != len(reference):
        return Comparison(False, f"returned {len(received)} output tensor(s), expected {len(reference)}")
    worst = Comparison(True, "", 0.0, 0.0, 0.0)
    for i, (ref, rec) in enumerate(zip(reference, received)):
        label = f"output[{i}]" if len(reference) > 1 else "output"
        out = rec["tensor"]
        if tuple(rec["shape"]) != tuple(ref.shape):
            return Comparison(False, f"{label} has shape {list(rec['shape'])}, expected {list(ref.shape)}")
        ref_dtype = str(ref.dtype).removeprefix("torch.")
        if rec["dtype"] != ref_dtype:
            return Comparison(False, f"{label} has dtype {rec['dtype']}, expected {ref_dtype}")
        if rec["device"] != ref.device.type:
            return Comparison(False, f"{label} is on {rec['device']}, expected {ref.device.type}")
        result = compare_tensor(ref, out, label, *tolerance_for(ref_dtype, atol, rtol))
        if not result.passed:
            return result
        worst.max_abs_err = max(worst.max_abs_err or 0.0, result.max_abs_err or 0.0)
        worst.max_rel_err = max(worst.max_rel_err or 0.0, result.max_rel_err or 0.0)
        worst.rel_l2_err = max(worst.rel_l2_err or 0.0, result.rel_l2_err or 0.0)
    return worst


# The relative L2 rule's least threshold: an output wrong by more than 1% of its L2 norm while every
# element is within atol is wrong wholesale (zeros, a dropped part, another scale); rounding is not.
L2_FLOOR = 1e-2

# Compare in chunks so the temporaries stay small: each chunk makes about ten of them (masks,
# the float64 squares). A chunk is 2^21 elements (under 100 MiB of temporaries; 2^26 put the
# reference of a 192 MiB matmul at 3.9x its I/O), or a 64th of the output when that is more:
# every chunk waits on the device a few times, and 768 chunks of a 6 GiB output doubled the
# time of its checks on an H100. So temporaries stay within about a sixth of the output.
CHUNK_ELEMENTS = 1 << 21
MAX_CHUNKS = 64


def chunk_elements(numel: int) -> int:
    return max(CHUNK_ELEMENTS, -(-numel // MAX_CHUNKS))


def compare_tensor(ref: torch.Tensor, out: torch.Tensor, label: str, atol: float,
                   rtol: float) -> Comparison:
    if ref.numel() == 0:
        return Comparison(True, "", 0.0, 0.0, 0.0)
    shape = tuple(ref.shape)
    r_all = ref.reshape(-1)
    o_all = out.reshape(-1).to(ref.device)
    if not ref.is_floating_point() and not ref.is_complex():
        if torch.equal(r_all, o_all):
            return Comparison(True, "", 0.0, 0.0, 0.0)
        diff_at = int(torch.nonzero(r_all != o_all)[0])
        return Comparison(False, f"{label} differs at {_index(diff_at, shape)}: expected "
                                 f"{r_all[diff_at].item()}, got {o_all[diff_at].item()}")
    work = _work_dtype(ref.dtype)
    # Errors of honest kernels scale with the output's magnitude, not with each element's:
    # near-zero elements of a long cumsum or a matmul carry the rounding of big partial sums.
    # So the absolute tolerance is at least rtol * RMS(ref); the relative L2 rule below still
    # catches outputs that are small next to atol.
    chunk = chunk_elements(r_all.numel())
    ref_sq = 0.0
    n_finite = 0
    for start in range(0, r_all.numel(), chunk):
        r = r_all[start:start + chunk].to(work)
        finite = torch.isfinite(r)
        ref_sq += float(torch.sum(torch.where(finite, r, 0).double() ** 2))
        n_finite += int(finite.sum())
    ref_rms = (ref_sq / n_finite) ** 0.5 if n_finite else 0.0
    atol = max(atol, rtol * ref_rms)
    max_abs = max_rel = 0.0
    err_sq = 0.0
    ref_absmax = 0.0
    n_outside = 0
    first_outside: int | None = None
    worst_at = 0
    for start in range(0, r_all.numel(), chunk):
        r = r_all[start:start + chunk].to(work)
        o = o_all[start:start + chunk].to(work)
        ref_finite = torch.isfinite(r)
        out_finite = torch.isfinite(o)
        # Non-finite values must sit where the reference has the same non-finite value.
        same_nonfinite = ~ref_finite & ((o == r) | (torch.isnan(o) & torch.isnan(r)))
        bad = (~out_finite & ~same_nonfinite) | (~ref_finite & out_finite)
        if bool(bad.any()):
            where = int(torch.nonzero(bad)[0])
            return Comparison(False, f"{label} has {int(bad.sum())}+ non-finite/finite mismatches; first "
                                     f"at {_index(start + where, shape)}: expected "
                                     f"{_fmt(r[where].item())}, got {_fmt(o[where].item())}")
        r = torch.where(ref_finite, r, 0)
        o = torch.where(ref_finite, o, 0)
        abs_err = (o - r).abs()
        chunk_max = float(abs_err.max())
        if chunk_max > max_abs or start == 0:
            max_abs = max(max_abs, chunk_max)
            worst_at = start + int(torch.argmax(abs_err))
        max_rel = max(max_rel, float((abs_err / r.abs().clamp_min(torch.finfo(work).tiny)).max()))
        err_sq += float(torch.sum(abs_err.double() ** 2))
        ref_absmax = max(ref_absmax, float(r.abs().max()))
        outside = abs_err > atol + rtol * r.abs()
        count = int(outside.sum())
        if count and first_outside is None:
            first_outside = start + int(torch.nonzero(outside)[0])
        n_outside += count
    rel_l2 = (err_sq ** 0.5) / (ref_sq ** 0.5) if ref_sq > 0 else 0.0
    if first_outside is not None:
        return Comparison(
            False,
            f"{label} mismatch: {n_outside}/{r_all.numel()} elements outside atol={atol:g}, "
            f"rtol={rtol:g}; first at {_index(first_outside, shape)}: expected "
            f"{_fmt(r_all[first_outside].item())}, got {_fmt(o_all[first_outside].item())}; "
            f"max abs err {_fmt(max_abs)} at {_index(worst_at, shape)}; rel L2 err {_fmt(rel_l2)}",
            max_abs, max_rel, rel_l2,
        )
    l2_limit = max(rtol, L2_FLOOR)
    if rel_l2 > l2_limit:
        return Comparison(
            False,
            f"{label} mismatch: relative L2 error {_fmt(rel_l2)} exceeds {l2_limit:g} although every "
            f"element is within atol={atol:g} (the output is small next to atol; max |ref| = "
            f"{_fmt(ref_absmax)}, max abs err {_fmt(max_abs)})",
            max_abs, max_rel, rel_l2,
        )
    return Comparison(True, "", max_abs, max_rel, rel_l2)


def compare_inputs(pristine: list, received: list[dict]) -> str | None:
    """None when the candidate left its tensor inputs bit-for-bit as generated; else why not."""
    tensors = [x for x in pristine if isinstance(x, torch.Tensor)]
    if len(tensors) != len(received):
        return f"sent back {len(received)} input tensors, expected {len(tensors)}"
    for i, (before, rec) in enumerate(zip(tensors, received)):
        after = rec["tensor"]
        if tuple(after.shape) != tuple(before.shape) or after.dtype != before.dtype:
            return f"input tensor {i} changed shape or dtype"
        a = before.reshape(-1)
        b = after.reshape(-1).to(before.device)
        if a.is_floating_point():  # bitwise, so that NaN == NaN
            bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
            a, b = a.view(bits), b.view(bits)
        changed = a != b
        if bool(changed.any()):
            first = int(torch.nonzero(changed)[0])
            return (f"input tensor {i} was modified in place: {int(changed.sum())} of {a.numel()} "
                    f"elements changed, first at {_index(first, tuple(before.shape))} (was "
                    f"{_fmt(before.reshape(-1)[first].item())}, now "
                    f"{_fmt(after.reshape(-1)[first].item())}); the inputs must not be written")
    return None
