"""The rules of a whole model's end-to-end check, in one place: the run (orchestrate/whole_model.py)
judges the spliced model with them, and `kernelagent eval --whole-model` judges it again with them.

PyTorch still runs every region that was not replaced, so the two rules that judge who did the
work report instead of rejecting: the static pass reports (`static_check="warn"`), PyTorch's
work is allowed and reported as `torch-work` (`torch_work="allow"`), and the Nsight Compute
evidence is off. Every kernel was judged with all of them on as a candidate of its own region
problem. The spliced file holds the kernels as code (child.py), so their launches are counted as
the candidate's own."""

from __future__ import annotations

from typing import Any

E2E_OVERRIDES = {"static_check": "warn", "torch_work": "allow", "kernel_evidence": False}
# In the docstring of every spliced model (child.py); `kernelagent eval` without --whole-model
# uses it only to say how such a file is judged, never to relax a rule.
MARK = "written by kernelagent optimize --whole-model"


def e2e_config(trials: int, **extra: Any) -> Any:
    from kernelagent.harness import EvalConfig

    return EvalConfig(trials=trials, **{**extra, **E2E_OVERRIDES})


def is_spliced(source: str) -> bool:
    """Does this file say it is a spliced whole model? (a hint only: anyone can write it)"""
    return MARK in source[:2000]
