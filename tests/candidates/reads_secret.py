"""Correct ReLU that fails loudly if it can see a secret or runs outside a scratch folder."""
import os

import torch
import torch.nn as nn

leaked = sorted(k for k in os.environ if "KEY" in k.upper() or "TOKEN" in k.upper() or "SECRET" in k.upper())
if leaked:
    raise RuntimeError(f"candidate saw secrets: {leaked}")
if "kernelagent-scratch" not in os.getcwd():
    raise RuntimeError(f"candidate runs in {os.getcwd()}, not a scratch directory")
if os.environ.get("HOME") != os.getcwd():
    raise RuntimeError("HOME is not the scratch directory")


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.clamp_min(x, 0.0)
