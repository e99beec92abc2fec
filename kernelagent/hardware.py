"""Device specs in one place: prompts, roofline bounds and the impossible-speed check read
from here. Datasheet peaks (dense, no sparsity) for the GPUs we know, merged with what torch
reports at run time (the harness's fingerprint).
"""

from __future__ import annotations

from typing import Any

# name fragment (lower case) -> datasheet facts. Bandwidth in GB/s, FLOP/s in TFLOP/s.
KNOWN_GPUS: dict[str, dict[str, Any]] = {
    "h200": {
        "name": "NVIDIA H200",
        "sm_count": 132,
        "l2_bytes": 60 * 1024**2,
        "mem_bandwidth_gbs": 4800.0,
        "peak_tflops": {"float64": 67.0, "float32": 67.0, "tf32": 495.0,
                        "bfloat16": 989.0, "float16": 989.0, "float8": 1979.0},
    },
    "h100": {
        "name": "NVIDIA H100 SXM",
        "sm_count": 132,
        "l2_bytes": 50 * 1024**2,
        "mem_bandwidth_gbs": 3350.0,
        "peak_tflops": {"float64": 67.0, "float32": 67.0, "tf32": 495.0,
                        "bfloat16": 989.0, "float16": 989.0, "float8": 1979.0},
    },
    "a100": {
        "name": "NVIDIA A100",
        "sm_count": 108,
        "l2_bytes": 40 * 1024**2,
        "mem_bandwidth_gbs": 2039.0,
        "peak_tflops": {"float64": 19.5, "float32": 19.5, "tf32": 156.0,
                        "bfloat16": 312.0, "float16": 312.0},
    },
}

# When the L2 size is unknown, flush with a buffer this large (bigger than any L2 we know).
DEFAULT_L2_FLUSH_BYTES = 256 * 1024**2


def lookup(gpu_name: str) -> dict[str, Any] | None:
    lowered = gpu_name.lower()
    for key, spec in KNOWN_GPUS.items():
        if key in lowered:
            return spec
    return None


def describe_device(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """Facts about the device in `fingerprint` (from Evaluator.fingerprint()).

    Run-time values from torch (SM count, L2 size, memory) override the table; datasheet
    bandwidth and peak FLOP/s come from the table. Unknown values are None.
    """
    if not fingerprint.get("cuda"):
        return {"name": "CPU (Triton interpreter)", "kind": "cpu", "sm_count": None,
                "l2_bytes": None, "mem_bytes": None, "mem_bandwidth_gbs": None,
                "peak_tflops": {}, "known": False}
    name = fingerprint.get("gpu_name", "unknown GPU")
    spec = lookup(name) or {}
    return {
        "name": name,
        "kind": "cuda",
        "sm_count": fingerprint.get("sm_count") or spec.get("sm_count"),
        "l2_bytes": fingerprint.get("l2_bytes") or spec.get("l2_bytes"),
        "mem_bytes": fingerprint.get("mem_bytes"),
        "mem_bandwidth_gbs": spec.get("mem_bandwidth_gbs"),
        "peak_tflops": dict(spec.get("peak_tflops", {})),
        "capability": fingerprint.get("capability"),
        "known": bool(spec),
    }


def roofline_floor_ms(device: dict[str, Any], bytes_moved: float, flops: float | None,
                      dtype: str) -> float | None:
    """The least time any kernel can take: max(bytes / peak bandwidth, flops / peak rate).

    Returns None when the device's peaks are unknown. Used as an impossible-speed bound, so
    it uses datasheet peaks (optimistic) rather than measured ones.
    """
    bandwidth = device.get("mem_bandwidth_gbs")
    if not bandwidth:
        return None
    floor_s = bytes_moved / (bandwidth * 1e9)
    peak = device.get("peak_tflops", {})
    if flops:
        # The fastest unit that could legally compute this dtype.
        rate = peak.get(dtype) or max(peak.values(), default=None)
        if rate:
            floor_s = max(floor_s, flops / (rate * 1e12))
    return floor_s * 1e3
