"""Device specs in one place: the prompts, the roofline bounds of the impossible-speed check
and the profile tool's roofline fractions all read from here.

Two sources, merged by `describe_device`:
- `KNOWN_GPUS`: datasheet facts (dense peaks, no sparsity) for the GPUs we know: SM count,
  L2 size, memory bandwidth and peak FLOP/s per dtype;
- `torch_device_facts`: what torch reports at run time (name, SM count, L2 size, memory,
  compute capability). The harness server records these in its fingerprint; run-time values
  win over the table where both exist.

Nothing here imports torch at module level.
"""

from __future__ import annotations

from typing import Any

# The CUDA runtime's and libraries' own words for an allocation that failed on the device (cuBLAS's
# handle for level1/3_Batched_matrix_multiplication's reference beside 36 other jobs on an H100:
# "CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)", once said to be a broken problem):
# the candidate's and reference's processes (child/common.py) and the server reading the reference's
# log (server/job.py) call such an error out of memory.
ALLOC_FAILED_WORDS = ("cudaErrorMemoryAllocation", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
                      "CUFFT_ALLOC_FAILED", "CUSOLVER_STATUS_ALLOC_FAILED", "CUSPARSE_STATUS_ALLOC_FAILED")

# Datasheet facts. Bandwidth in GB/s, peaks in TFLOP/s (dense). "float32" is the plain FP32
# (non-tensor-core) rate; "tf32" the tensor-core TF32 rate.
_H100_SXM_PEAKS = {"float64": 67.0, "float32": 67.0, "tf32": 494.7, "bfloat16": 989.4, "float16": 989.4,
                   "float8": 1978.9, "int8": 1978.9}
KNOWN_GPUS: dict[str, dict[str, Any]] = {
    "h200": {
        "name": "NVIDIA H200",
        "sm_count": 132,
        "l2_bytes": 50 * 1024**2,
        "mem_bandwidth_gbs": 4800.0,
        "peak_tflops": dict(_H100_SXM_PEAKS),
    },
    "h100-pcie": {
        "name": "NVIDIA H100 PCIe",
        "sm_count": 114,
        "l2_bytes": 50 * 1024**2,
        "mem_bandwidth_gbs": 2000.0,
        "peak_tflops": {"float64": 51.0, "float32": 51.0, "tf32": 378.0, "bfloat16": 756.0, "float16": 756.0,
                        "float8": 1513.0, "int8": 1513.0},
    },
    "h100": {
        "name": "NVIDIA H100 SXM",
        "sm_count": 132,
        "l2_bytes": 50 * 1024**2,
        "mem_bandwidth_gbs": 3350.0,
        "peak_tflops": dict(_H100_SXM_PEAKS),
    },
    "a100-40gb": {
        "name": "NVIDIA A100 40GB",
        "sm_count": 108,
        "l2_bytes": 40 * 1024**2,
        "mem_bandwidth_gbs": 1555.0,
        "peak_tflops": {"float64": 19.5, "float32": 19.5, "tf32": 156.0, "bfloat16": 312.0, "float16": 312.0,
                        "int8": 624.0},
    },
    "a100": {
        "name": "NVIDIA A100 80GB",
        "sm_count": 108,
        "l2_bytes": 40 * 1024**2,
        "mem_bandwidth_gbs": 2039.0,
        "peak_tflops": {"float64": 19.5, "float32": 19.5, "tf32": 156.0, "bfloat16": 312.0, "float16": 312.0,
                        "int8": 624.0},
    },
}

# How torch names them -> key in KNOWN_GPUS; the first match wins, so specific names first.
# ("NVIDIA H100 80GB HBM3" is the SXM part, "NVIDIA A100-SXM4-40GB" / "NVIDIA A100-PCIE-40GB" the
# 40 GB parts.)
_NAME_PATTERNS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("h200",), "h200"),
    (("h100", "pcie"), "h100-pcie"),
    (("h100",), "h100"),
    (("a100", "40gb"), "a100-40gb"),
    (("a100",), "a100"),
)

# When the L2 size is unknown, flush with a buffer this large (bigger than any L2 we know).
DEFAULT_L2_FLUSH_BYTES = 256 * 1024**2


def lookup(gpu_name: str) -> dict[str, Any] | None:
    """Datasheet facts for a GPU name as torch reports it, or None for an unknown GPU."""
    lowered = gpu_name.lower()
    for fragments, key in _NAME_PATTERNS:
        if all(f in lowered for f in fragments):
            return KNOWN_GPUS[key]
    return None


def torch_device_facts(index: int = 0) -> dict[str, Any]:
    """What torch reports about CUDA device `index` (initialises CUDA: call it in a child)."""
    import torch

    props = torch.cuda.get_device_properties(index)
    return {
        "gpu_name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "mem_bytes": props.total_memory,
    }


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


def peak_rate_tflops(device: dict[str, Any], dtype: str, legal_fastest: bool = False) -> float | None:
    """The peak FLOP/s (TFLOP/s) for computing in `dtype`.

    legal_fastest=True gives the fastest rate a kernel could legally reach at the problem's
    accuracy (the impossible-speed bound): for float32, split-TF32 (3xTF32) reaches fp32
    accuracy at a third of the TF32 rate, so the bound is max(fp32, tf32/3).
    """
    peak = device.get("peak_tflops") or {}
    if not peak:
        return None
    rate = peak.get(dtype)
    if legal_fastest and dtype == "float32":
        rate = max(rate or 0.0, peak.get("tf32", 0.0) / 3) or None
    if rate is None and legal_fastest:
        rate = max(peak.values())
    return rate


def roofline_floor(device: dict[str, Any], bytes_moved: float, flops: float | None,
                   dtype: str) -> tuple[float | None, str]:
    """(least time in ms any kernel can take, how it was computed): max(bytes / peak
    bandwidth, flops / peak rate) with datasheet (optimistic) peaks. (None, why) when the
    device's peaks are unknown."""
    if device.get("kind") == "cpu":
        return None, "not applicable on the CPU"
    bandwidth = device.get("mem_bandwidth_gbs")
    if not bandwidth:
        return None, f"no datasheet bandwidth for {device.get('name')}"
    floor_s = bytes_moved / (bandwidth * 1e9)
    how = f"{bytes_moved / 1e6:.1f} MB at {bandwidth:.0f} GB/s"
    if flops:
        rate = peak_rate_tflops(device, dtype, legal_fastest=True)
        if rate and flops / (rate * 1e12) > floor_s:
            floor_s = flops / (rate * 1e12)
            how = f"{flops / 1e9:.2f} GFLOP at {rate:.0f} TFLOP/s ({dtype})"
    return floor_s * 1e3, how


def roofline_floor_ms(device: dict[str, Any], bytes_moved: float, flops: float | None,
                      dtype: str) -> float | None:
    """The least time any kernel can take, in ms (None when the peaks are unknown)."""
    return roofline_floor(device, bytes_moved, flops, dtype)[0]


def roofline_fractions(device: dict[str, Any], bytes_moved: float, flops: float | None, dtype: str,
                       time_ms: float) -> dict[str, Any]:
    """Achieved bandwidth and FLOP/s for a measured time, as fractions of the device's peaks.

    `bound` names the roof that is closer: "memory" or "compute" (by arithmetic intensity
    against the ridge point when FLOPs are known, else memory). Fractions are None where the
    peak is unknown.
    """
    out: dict[str, Any] = {"bytes": bytes_moved, "flops": flops, "dtype": dtype, "time_ms": time_ms,
                           "achieved_gbs": None, "achieved_tflops": None, "bandwidth_fraction": None,
                           "compute_fraction": None, "peak_gbs": device.get("mem_bandwidth_gbs"),
                           "peak_tflops": peak_rate_tflops(device, dtype), "bound": "memory",
                           "roofline_fraction": None, "floor_ms": None}
    if time_ms <= 0:
        return out
    seconds = time_ms / 1e3
    out["achieved_gbs"] = bytes_moved / seconds / 1e9
    if flops:
        out["achieved_tflops"] = flops / seconds / 1e12
    if out["peak_gbs"]:
        out["bandwidth_fraction"] = out["achieved_gbs"] / out["peak_gbs"]
    if flops and out["peak_tflops"]:
        out["compute_fraction"] = out["achieved_tflops"] / out["peak_tflops"]
    if out["peak_gbs"] and flops and out["peak_tflops"]:
        ridge = out["peak_tflops"] * 1e12 / (out["peak_gbs"] * 1e9)  # FLOP per byte
        intensity = flops / max(bytes_moved, 1.0)
        out["intensity"], out["ridge"] = intensity, ridge
        out["bound"] = "compute" if intensity > ridge else "memory"
    floor = max((bytes_moved / (out["peak_gbs"] * 1e9)) if out["peak_gbs"] else 0.0,
                (flops / (out["peak_tflops"] * 1e12)) if flops and out["peak_tflops"] else 0.0)
    if floor > 0:
        out["floor_ms"] = floor * 1e3
        out["roofline_fraction"] = floor / seconds  # 1.0 = at the roof
    return out
