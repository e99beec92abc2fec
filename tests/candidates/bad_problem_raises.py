import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x


def get_inputs():
    raise RuntimeError("broken get_inputs")


def get_init_inputs():
    return []
