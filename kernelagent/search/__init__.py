"""Search over candidates: many per round, a population across rounds (`--strategy`).

    strategies.py  which nodes to grow each round (best-of-n, beam, evolve)
    runner.py      the rounds: concurrent model calls and evaluations, one budget, the final check
    tree.py        the record: one node per model call, saved after every change; resume, exports

`single` is the agent loop itself (kernelagent/agent/loop.py); a search reuses its model
protocol, tools, prompts, exceptions and final verification.
"""

from kernelagent.search.runner import Search, SearchConfig
from kernelagent.search.strategies import STRATEGIES, make
from kernelagent.search.tree import Node, Tree, load, normalised_hash, records

__all__ = ["STRATEGIES", "Node", "Search", "SearchConfig", "Tree", "load", "make", "normalised_hash", "records"]
