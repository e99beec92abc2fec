"""A small row softmax (sizes as module constants, no extra or smoke inputs): the harness derives
its other-shape check sets from the constants (harness/derive)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


batch_size = 24
dim = 200


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
