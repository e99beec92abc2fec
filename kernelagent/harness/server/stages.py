"""The exceptions a job's stages raise to its supervisor (job.py, checks.py, timed.py)."""

from __future__ import annotations


class StageTimeout(Exception):
    pass


class CandidateGone(Exception):
    pass


class ReferenceGone(Exception):
    pass


class Stop(Exception):
    """The job has its verdict (a failure was reported): stop supervising."""
