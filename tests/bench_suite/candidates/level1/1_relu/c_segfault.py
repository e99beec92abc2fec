"""Crashes the process: dereferences a null pointer (SIGSEGV)."""
import ctypes

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        ctypes.string_at(0)
        return x
