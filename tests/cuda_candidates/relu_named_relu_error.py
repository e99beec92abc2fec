"""A CUDA candidate for tests/candidates/relu_problem.py whose extension function is called
`relu` (so Python calls `_ext.relu(x)`, which is not a tensor method) and whose CUDA source has
a real error: `fmaxf` given three arguments. The static pass must let it through, and the build
must report that error."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f, 1.f);
}

torch::Tensor relu(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel();
    if (n > 0) relu_kernel<<<(n + 255) / 256, 256>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

CPP_SRC = "torch::Tensor relu(torch::Tensor x);"

_ext = load_inline(name="ka_relu_named_relu", cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC, functions=["relu"],
                   extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        return _ext.relu(x)
