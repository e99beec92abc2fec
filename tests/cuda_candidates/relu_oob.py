"""A CUDA candidate with an out-of-bounds write for tests/candidates/relu_problem.py (ReLU)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = v > 0.f ? v : 0.f;
        y[i + (1L << 36)] = v;  // far out of bounds: an illegal memory access
    }
}

torch::Tensor relu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel();
    int threads = 256;
    long blocks = (n + threads - 1) / threads;
    if (n > 0) relu_kernel<<<blocks, threads>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

CPP_SRC = "torch::Tensor relu_forward(torch::Tensor x);"

ext = load_inline(name="ka_relu_oob", cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC,
                  functions=["relu_forward"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        return ext.relu_forward(x)
