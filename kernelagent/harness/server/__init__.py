"""The harness server process: the serve loop and the per-job jail (jail.py)."""
