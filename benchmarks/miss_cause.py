"""What a miss met (issue 58, scope 3): the `cause` record that benchmarks/profiler_agreement.py
and benchmarks/fidelity.py attach to every row that misses its target, built only from what the
run measured:

  neighbours   the result's `concurrency` (harness/server/gate.py, job.py, caller/evaluator.py):
               whether another job shared the device, the wait for the timing slot and for an
               idle device, whether the job was re-run alone by the harness, and how many
               evaluations the script itself had in flight when it started
  sm_clocks    the SM clock over the timed loop (timings.candidate.clocks_mhz: the mean of the
               loop's first decile and of its last, NVML)
  host_share   per_call: the device and wall time per call and the share of the wall time the
               device ran none of the call's kernels (caller/clocks.py)
  bandwidth    the idle probes' memory-bandwidth reading (copy_us, the slowest) and the wait for
               quiet bandwidth before a timed loop (bandwidth_wait_s, bandwidth_busy: gate.Bandwidth)
  rerun_alone  one more evaluation of the same candidate with nothing beside it, its figures
               beside the miss's (filled in by each script)

A fact the run did not record is NOT_RECORDED, never guessed."""

from __future__ import annotations

import math

NOT_RECORDED = "not recorded"


def _num(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        return None
    return float(value)


def neighbours(concurrency, in_flight=None) -> dict | str:
    """Who ran beside the evaluation, from its `concurrency` and the script's count in flight."""
    c = concurrency if isinstance(concurrency, dict) else {}
    count = in_flight if isinstance(in_flight, int) and not isinstance(in_flight, bool) else None
    if not c and count is None:
        return NOT_RECORDED
    known = "shared_device" in c  # the server concluded the job's concurrency
    out = {"in_flight": count if count is not None else NOT_RECORDED,
           "shared_device": c["shared_device"] if isinstance(c.get("shared_device"), bool) else NOT_RECORDED,
           "retried_alone": bool(c.get("retried_alone")) if known or "retried_alone" in c else NOT_RECORDED}
    for key, name in (("wait_s", "slot_wait_s"), ("idle_wait_s", "idle_wait_s")):
        value = _num(c.get(key))
        out[name] = round(value, 4) if value is not None else NOT_RECORDED
    if c.get("alloc_retries"):
        out["alloc_retries"] = c["alloc_retries"]
    return out


def sm_clocks(clocks_mhz) -> dict | str:
    """[first decile, last decile] of the loop's SM clock, and the drop between them."""
    if not isinstance(clocks_mhz, (list, tuple)) or len(clocks_mhz) != 2:
        return NOT_RECORDED
    first, last = (_num(c) for c in clocks_mhz)
    if first is None or last is None or first <= 0:
        return NOT_RECORDED
    return {"first_mhz": first, "last_mhz": last, "drop_pct": round(100.0 * (first - last) / first, 2)}


def host_share(per_call) -> dict | str:
    """The device and wall time per call and the host share between them (result.per_call)."""
    if not isinstance(per_call, dict):
        return NOT_RECORDED
    device, wall, share = (_num(per_call.get(k)) for k in ("device_ms", "wall_ms", "host_share"))
    if device is None or wall is None or share is None:
        return NOT_RECORDED
    return {"host_share": share, "device_ms": device, "wall_ms": wall}


def bandwidth(concurrency) -> dict | str:
    """The bandwidth facts of the evaluation's idle probes. Where the probes read bandwidth
    (copy_us) and no wait was recorded, the wait was nil: the server adds the key only on one."""
    c = concurrency if isinstance(concurrency, dict) else {}
    copy_us, wait = _num(c.get("copy_us")), _num(c.get("bandwidth_wait_s"))
    busy = c.get("bandwidth_busy") if isinstance(c.get("bandwidth_busy"), bool) else None
    if copy_us is None and wait is None and busy is None:
        return NOT_RECORDED
    read = copy_us is not None
    return {"copy_us": copy_us if read else NOT_RECORDED,
            "wait_s": round(wait, 4) if wait is not None else (0.0 if read else NOT_RECORDED),
            "busy": busy if busy is not None else (False if read else NOT_RECORDED)}


def cause(*, concurrency, clocks_mhz, per_call, in_flight=None, rerun_alone=NOT_RECORDED) -> dict:
    """The whole record, each fact or NOT_RECORDED."""
    return {"neighbours": neighbours(concurrency, in_flight), "sm_clocks": sm_clocks(clocks_mhz),
            "host_share": host_share(per_call), "bandwidth": bandwidth(concurrency),
            "rerun_alone": rerun_alone if rerun_alone is not None else NOT_RECORDED}


def _fmt(value, spec: str) -> str:
    return value if isinstance(value, str) else format(value, spec)


def neighbours_text(n) -> str:
    if isinstance(n, str):
        return f"neighbours {n}"
    shared = {True: "shared the device", False: "alone on the device"}.get(n["shared_device"], "sharing not recorded")
    text = (f"neighbours: {_fmt(n['in_flight'], 'd')} in flight, {shared}, slot wait {_fmt(n['slot_wait_s'], '.3f')} s, "
            f"idle wait {_fmt(n['idle_wait_s'], '.3f')} s")
    if n["retried_alone"] is True:
        text += ", re-run alone by the harness"
    if n.get("alloc_retries"):
        text += f", allocator retries {n['alloc_retries']}"
    return text


def line(record: dict, rerun_text: str | None = None) -> str:
    """The record in one line for a table cell (no '|' in it)."""
    clocks, share, bw = record["sm_clocks"], record["host_share"], record["bandwidth"]
    parts = [neighbours_text(record["neighbours"]),
             f"SM clock {clocks}" if isinstance(clocks, str) else
             f"SM clock {clocks['first_mhz']:.0f}->{clocks['last_mhz']:.0f} MHz ({clocks['drop_pct']:+.1f}% drop)",
             f"host share {share}" if isinstance(share, str) else
             f"host share {100 * share['host_share']:.1f}% (device {share['device_ms']:.4f} of wall "
             f"{share['wall_ms']:.4f} ms)",
             f"bandwidth {bw}" if isinstance(bw, str) else
             f"bandwidth: copy {_fmt(bw['copy_us'], '.1f')} us, waited {_fmt(bw['wait_s'], '.3f')} s"
             + (", never quiet" if bw["busy"] is True else "")]
    rerun = record["rerun_alone"]
    parts.append(rerun_text if rerun_text is not None else
                 f"re-run alone {rerun}" if isinstance(rerun, str) else "re-run alone: see JSON")
    return "; ".join(parts).replace("|", "/")
