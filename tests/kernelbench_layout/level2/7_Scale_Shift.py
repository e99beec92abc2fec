import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Per-feature scale and shift with learned parameters, KernelBench style:
    sizes come from the constructor arguments.
    """
    def __init__(self, features, shift):
        super(Model, self).__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.shift = shift

    def forward(self, x):
        return x * self.weight + self.shift

batch_size = 128
features = 4099
shift = 0.5

def get_inputs():
    return [torch.randn(batch_size, features)]

def get_init_inputs():
    return [features, shift]
