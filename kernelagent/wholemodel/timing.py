"""The plan's CPU times from interleaved rounds (no torch here: child.py hands in what to run).

Each round runs the captured graph once, timing every node and the whole graph's forward with
the same clock, then the model's own forward: load from other processes hits the nodes and the
forward of a round alike. A node's time is the median of its rounds less the clock's own cost;
the forward's is the median of its rounds. Within a round the nodes run one after another inside
the forward, so their times sum to at most the forward; the medians may overshoot a little, never
by more than TOLERANCE in an honest measurement. A measurement past that is taken again (child.py)
and, if it stays so, flagged. The forward's spread over the rounds is the plan's noise: a middle
half of the rounds wider than UNSTEADY of the median means the machine's load moved while the plan
measured, and the plan says so.
"""

from __future__ import annotations

import time
from typing import Any, Callable

ROUNDS = 9
ATTEMPTS = 3
TOLERANCE = 0.05  # the nodes' medians may sum past the forward's median by this much
UNSTEADY = 0.25  # the forward's interquartile range over its median past which the plan warns


# The clock, in ns: wall time (the profiler's "CPU time" was wall time too). The plan runs torch on
# one thread on the CPU, so no op waits for a pool thread that another process holds off the CPU.
CLOCK: Callable[[], int] = time.perf_counter_ns


def one_round(index: int, prepare: Callable[[], Callable[[Any], Any]],
              run_model: Callable[[], Any]) -> tuple[dict, float, float]:
    """({node: us}, the graph's forward us, the model's forward us) of round `index`. `prepare()`
    gives the captured graph's run, untimed (its arguments made); that run, given `timer`, calls
    `timer(name, fn)` for each node."""
    clock = CLOCK
    run_graph = prepare()
    nodes: dict[str, float] = {}

    def timer(name: str, fn: Callable[[], Any]) -> Any:
        start = clock()
        value = fn()
        nodes[name] = (clock() - start) / 1e3
        return value

    start = clock()
    run_graph(timer)
    forward = (clock() - start) / 1e3
    start = clock()
    run_model()
    return nodes, forward, (clock() - start) / 1e3


def measure(prepare: Callable[[], Callable[[Any], Any]], run_model: Callable[[], Any]) -> dict[str, Any]:
    """summarise() of ROUNDS rounds, taken again (up to ATTEMPTS in all) while the nodes sum past
    their forward; the totals say how many attempts it took and whether the last was consistent."""
    for attempt in range(1, ATTEMPTS + 1):
        rounds, forwards, models = [], [], []
        for index in range(ROUNDS):
            nodes, forward, model = one_round(index, prepare, run_model)
            rounds.append(nodes)
            forwards.append(forward)
            models.append(model)
        clock = CLOCK
        empty = []
        for _ in range(4 * ROUNDS):  # what a timed span costs by itself
            start = clock()
            empty.append((clock() - start) / 1e3)
        result = summarise(rounds, forwards, models, median(empty))
        result["totals"].update(attempts=attempt, consistent=consistent(result["totals"]))
        if result["totals"]["consistent"]:
            break
    return result


def median(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def quartiles(values: list[float]) -> tuple[float, float]:
    """(first, third) quartile: the medians of the lower and upper halves."""
    ordered = sorted(values)
    half = len(ordered) // 2
    if not half:
        return (ordered[0], ordered[0]) if ordered else (0.0, 0.0)
    return median(ordered[:half]), median(ordered[-half:])


def noise(values: list[float]) -> float:
    """The uncertainty of the median of `values`: its standard error, 1.2533 sigma / sqrt(n), with
    sigma from the median absolute deviation (1.4826 MAD), which rounds an outside process slowed
    (up to half of them) do not move."""
    if len(values) < 2:
        return 0.0
    middle = median(values)
    mad = median([abs(v - middle) for v in values])
    return 1.2533 * 1.4826 * mad / len(values) ** 0.5


def summarise(rounds: list[dict[str, float]], forwards: list[float], models: list[float],
              overhead: float) -> dict[str, Any]:
    """Per node {name: {"time_us", "share", "noise"}} and the totals, from `rounds` (each {node: us})
    and the forward's and the model's times of the same rounds; `overhead` is the clock's own cost
    per timed span, taken out of each node.

    A node's share is the median over the rounds of its fraction of its round's nodes, so a round
    the load slowed as a whole weighs as much as any other; the shares are then scaled to sum to 1,
    and a node's time is its share of the nodes' time (the sum of each node's median). Its noise is the uncertainty of that
    median (noise()), which the ranking reads."""
    names: dict[str, None] = {}
    for r in rounds:
        names.update(dict.fromkeys(r))
    cleaned = [{name: max(0.0, r.get(name, 0.0) - overhead) for name in names} for r in rounds]
    sums = [sum(r.values()) for r in cleaned]
    fractions = {name: [r[name] / total if total > 0 else 0.0 for r, total in zip(cleaned, sums)] for name in names}
    medians = {name: median(values) for name, values in fractions.items()}
    scale = sum(medians.values()) or 1.0
    nodes_us = sum(median([r[name] for r in cleaned]) for name in names)  # each op's own median, summed
    per_node = {name: {"time_us": nodes_us * medians[name] / scale, "share": medians[name] / scale,
                       "noise": noise(fractions[name]) / scale} for name in names}
    forward = median(forwards)
    low, high = quartiles(forwards)
    spread = (high - low) / forward if forward > 0 else 0.0
    totals = {"nodes_us": round(nodes_us, 3), "graph_forward_us": round(forward, 3),
              "model_forward_us": round(median(models), 3),
              "nodes_vs_forward": round(nodes_us / forward, 4) if forward > 0 else None,
              "noise": {"rounds": len(forwards), "forward_min_us": round(min(forwards, default=0.0), 3),
                        "forward_median_us": round(forward, 3), "forward_max_us": round(max(forwards, default=0.0), 3),
                        "forward_spread": round(spread, 4), "tolerance": TOLERANCE, "unsteady_above": UNSTEADY,
                        "share_error": round(max((v["noise"] for v in per_node.values()), default=0.0), 6)}}
    return {"per_node": per_node, "totals": totals}


def consistent(totals: dict[str, Any]) -> bool:
    ratio = totals.get("nodes_vs_forward")
    return ratio is None or ratio <= 1.0 + TOLERANCE


def unsteady(totals: dict[str, Any]) -> bool:
    return float((totals.get("noise") or {}).get("forward_spread") or 0.0) > UNSTEADY


def warnings(totals: dict[str, Any]) -> list[str]:
    """One line per thing the measurement says about itself: inconsistent, then unsteady."""
    said = []
    n = totals.get("noise") or {}
    if not consistent(totals):
        said.append(f"the regions sum to {totals['nodes_vs_forward']:.0%} of the forward they ran in, past its "
                    f"{1 + TOLERANCE:.0%} (measured {totals.get('attempts', 1)} times): the shares are flagged as "
                    "unreliable")
    if unsteady(totals):
        said.append(f"the forward's time moved between the plan's {n.get('rounds')} rounds "
                    f"({n.get('forward_min_us', 0):.1f} to {n.get('forward_max_us', 0):.1f} us, the middle half "
                    f"{n.get('forward_spread', 0):.0%} of the median): the machine's load changed while it measured; "
                    "the medians are shown, plan again on a quieter machine to trust the order")
    return said
