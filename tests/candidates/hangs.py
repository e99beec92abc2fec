"""Hangs in its forward call."""
import time

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        while True:
            time.sleep(0.1)
