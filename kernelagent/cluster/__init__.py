"""Below the reward service (kernelagent/rl) and the bench (kernelagent/bench): what both use to run
harnesses on a Ray cluster (actors.py) and to turn source text into a problem file (sources.py)."""
