"""Group a captured graph's nodes into regions and rank them by device time (no torch here).

A region is one op, or a chain of fusable ops: an anchor (a GEMM, a convolution, attention)
with the elementwise, norm and reduction epilogue that follows it, or such a chain on its own
(norm + activation). A chain grows from its tail to the tail's only user while that user is
fusable; so every node of a region but the last has its one user inside the region, and the
region has one output, its last node. One more anchor may join when the region already holds an
anchor followed by a softmax (matmul, scale, softmax, matmul: attention). A node that changes
model state in place (batch-norm running statistics in training mode) is never extracted: its
region stays in the model as it is, and the plan says why.

The order is by time where the plan's measured noise lets it tell, else the graph's order (rank).

Amdahl's bound beside each region: the whole model's speedup if the region took no time at all,
1 / (1 - share).
"""

from __future__ import annotations

from typing import Any

from kernelagent.wholemodel.ops import fusable

SOFTMAXES = ("softmax", "_softmax", "log_softmax", "_log_softmax")


def group(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Regions over `nodes` (capture's compute nodes, in graph order), hottest first."""
    by_name = {n["name"]: n for n in nodes}
    assigned: dict[str, int] = {}
    regions: list[list[dict[str, Any]]] = []
    for node in nodes:
        if node["name"] in assigned or not node.get("tensor", True) or node["kind"] == "view":
            continue
        chain = [node]
        assigned[node["name"]] = len(regions)
        while True:
            users = [by_name[u] for u in chain[-1].get("users", []) if u in by_name]
            if len(users) != 1 or len(chain[-1].get("users", [])) != 1:
                break
            nxt = users[0]
            if nxt["name"] in assigned or nxt.get("mutates") or not nxt.get("tensor", True):
                break
            anchors = [n for n in chain if n["kind"] == "anchor"]
            if nxt["kind"] == "anchor":
                after = chain[chain.index(anchors[0]) + 1:] if anchors else []
                if not (len(anchors) == 1 and any(n["op"] in SOFTMAXES for n in after)):
                    break
            elif not fusable(nxt["kind"]):
                break
            chain.append(nxt)
            assigned[nxt["name"]] = len(regions)
        regions.append(chain)
    total = sum(float(n.get("time_us") or 0.0) for n in nodes)
    out = rank([describe(chain, by_name, total) for chain in regions])
    for index, region in enumerate(out):
        region["id"] = f"region_{index}"
    return out


def rank(regions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`regions` (in graph order) hottest first where the plan's noise lets it tell: sorted by share,
    then each region whose share is within the noise (both regions' `noise`, summed) of the hottest
    region of its group joins that group, and a group is put back in graph order. So a region goes
    ahead of an earlier one in the graph only when its lead is clear of the noise, and two plans
    whose shares differ by noise give the same order. `clear_lead`: the region's lead over the
    next is clear of the noise."""
    by_share = sorted(enumerate(regions), key=lambda ir: (-ir[1]["share"], ir[0]))
    groups: list[list[tuple[int, dict[str, Any]]]] = []
    for index, region in by_share:
        if groups:
            head = groups[-1][0][1]
            if head["share"] - region["share"] <= head.get("noise", 0.0) + region.get("noise", 0.0):
                groups[-1].append((index, region))
                continue
        groups.append([(index, region)])
    out: list[dict[str, Any]] = []
    for members in groups:
        ordered = [r for _i, r in sorted(members, key=lambda ir: ir[0])]
        for position, region in enumerate(ordered):
            region["clear_lead"] = position == len(ordered) - 1
        out.extend(ordered)
    return out


def label(ops: list[str], kinds: list[str]) -> str:
    compute = [(o, k) for o, k in zip(ops, kinds) if k != "view"]
    anchors = [o for o, k in compute if k == "anchor"]
    if len(anchors) == 2 or any("attention" in o for o in anchors):
        return "attention"
    if anchors:
        base = "conv" if "conv" in anchors[0] else "gemm"
        return base + ("+epilogue" if len(compute) > 1 else "")
    if any(k == "norm" for _o, k in compute) and len(compute) > 1:
        return "norm+activation"
    if len(compute) == 1:
        return compute[0][1] if compute else "view"
    return "elementwise chain" if all(k == "elementwise" for _o, k in compute) else "fused chain"


def describe(chain: list[dict[str, Any]], by_name: dict[str, dict[str, Any]], total_us: float) -> dict[str, Any]:
    names = {n["name"] for n in chain}
    inputs: list[str] = []
    for n in chain:
        for arg in n.get("args", []):
            if arg not in names and arg not in inputs:
                inputs.append(arg)
    time_us = sum(float(n.get("time_us") or 0.0) for n in chain)
    measured = all("share" in n for n in chain)  # the CPU's rounds: each node's share and its noise
    noise = sum(float(n.get("noise") or 0.0) ** 2 for n in chain) ** 0.5
    share = (sum(float(n["share"]) for n in chain) if measured else time_us / total_us if total_us > 0 else 0.0)
    kinds = [n["kind"] for n in chain]
    ops = [n["op"] for n in chain]
    compute = [k for k in kinds if k != "view"]
    last = chain[-1]
    why = None
    if any(n.get("mutates") for n in chain):
        why = "it changes model state in place (e.g. batch-norm running statistics in training mode)"
    elif any(n.get("unextractable") for n in chain):
        why = next(n["unextractable"] for n in chain if n.get("unextractable"))
    elif not last.get("tensor", True):
        why = "its result is not a tensor"
    return {"nodes": [n["name"] for n in chain], "ops": ops, "kind": label(ops, kinds),
            "fusable": len(compute) >= 2, "time_us": round(time_us, 3), "noise": round(noise, 6), "share": round(share, 6),
            "amdahl_bound": round(1.0 / (1.0 - share), 4) if share < 1.0 else None,
            "inputs": inputs, "output": last["name"], "shape": last.get("shape"), "dtype": last.get("dtype"),
            "extractable": why is None, "why_not": why}
