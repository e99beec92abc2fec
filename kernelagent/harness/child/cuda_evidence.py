"""Evidence gathered on a CUDA device in the candidate's process (child/candidate_side.py): stale
memory poisoned before each check (exploit class 8 in child/defences.py), and one profiled call's
share of device time in the candidate's own kernels (class 1)."""

from __future__ import annotations

from typing import Any


def poison_cuda_memory(device: Any, nbytes: int) -> None:
    """Fill the caching allocator's free memory with NaN bytes (0xFF), so that an output
    that is allocated and never written reads as NaN rather than as an older result."""
    import torch

    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    size = int(min(max(nbytes, 1 << 20), free * 0.25))
    if size > 0:
        filler = torch.empty(size, dtype=torch.uint8, device=device)
        filler.fill_(0xFF)
        del filler
    small = [torch.empty(1 << 20, dtype=torch.uint8, device=device).fill_(0xFF) for _ in range(8)]
    del small


def device_time_share(model: torch.nn.Module, values: list[Any], own_names: set[str],
                      device: torch.device) -> dict[str, Any]:
    """One profiled call: the share of device time in the candidate's own kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model(*values)
        torch.cuda.synchronize(device)
    rows: dict[str, float] = {}
    for event in prof.events():  # kernels, memcpy and memset on the device
        if not str(getattr(event, "device_type", "")).endswith("CUDA"):
            continue
        try:
            us = float(event.time_range.elapsed_us())
        except Exception:  # noqa: BLE001
            us = float(getattr(event, "device_time_total", 0.0) or 0.0)
        rows[event.name] = rows.get(event.name, 0.0) + us
    total = sum(rows.values())
    if total <= 0:
        return {"share": None, "top": []}

    # Glue by kernel name: one rule here and in the out-of-process evidence (server/kernel_evidence.py).
    from kernelagent.harness.cuda_source import is_glue_kernel, is_own_kernel

    def own(name: str) -> bool:
        return is_own_kernel(name, own_names)

    kind = {k: "own" if own(k) else "glue" if is_glue_kernel(k) else "" for k in rows}
    own_us = sum(v for k, v in rows.items() if kind[k] == "own")
    glue_us = sum(v for k, v in rows.items() if kind[k] == "glue")
    top = [{"name": k, "share": v / total, "own": kind[k] == "own", "glue": kind[k] == "glue"}
           for k, v in sorted(rows.items(), key=lambda kv: -kv[1])]
    return {"share": own_us / total, "glue_share": glue_us / total, "top": top[:5], "total_us": total}
