"""KernelBench level1/46_Average_Pooling_3D: nn.AvgPool3d (count_include_pad, floor mode) in Triton.

A program computes BLOCK outputs of one output depth of one (sample, channel) (the (oh, ow)
positions flattened), summing the kd x kh x kw window with masked loads (zero padding counts, as in PyTorch's
default). Any kernel size, stride and padding (ints or triples) and any input size.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

_BLOCK = 256  # outputs per program, over the flattened (oh, ow) plane of one output depth


@triton.jit
def _avgpool3d_kernel(x_ptr, y_ptr, D, H, W, OD, OH, OW, KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
                      SD, SH, SW, PD, PH, PW, inv_vol, BLOCK: tl.constexpr):
    layer = tl.program_id(0).to(tl.int64)  # (n * C + c) * OD + od
    od = layer % OD
    plane = layer // OD
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    out_mask = offs < OH * OW
    oh = offs // OW
    ow = offs % OW
    x_vol = x_ptr + plane * D * H * W
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    # The depth index as a vector like ow (folded by the compiler): the interpreter cannot AND
    # a scalar condition into a block mask.
    d0 = od * SD - PD + offs * 0
    h0 = oh * SH - PH
    w0 = ow * SW - PW
    for kd in tl.static_range(KD):
        d = d0 + kd
        d_ok = out_mask & (d >= 0) & (d < D)
        for kh in tl.static_range(KH):
            h = h0 + kh
            dh_ok = d_ok & (h >= 0) & (h < H)
            for kw in tl.static_range(KW):
                w = w0 + kw
                m = dh_ok & (w >= 0) & (w < W)
                acc += tl.load(x_vol + (d * H + h) * W + w, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + layer * OH * OW + offs, (acc * inv_vol).to(y_ptr.dtype.element_ty), mask=out_mask)


def _triple(v):
    return tuple(int(i) for i in v) if isinstance(v, (tuple, list)) else (int(v),) * 3


class ModelNew(nn.Module):
    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size = _triple(kernel_size)
        self.stride = _triple(stride) if stride is not None else self.kernel_size
        self.padding = _triple(padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (kd, kh, kw), (sd, sh, sw), (pd, ph, pw) = self.kernel_size, self.stride, self.padding
        xc = x.contiguous()
        D, H, W = xc.shape[-3:]
        OD = (D + 2 * pd - kd) // sd + 1
        OH = (H + 2 * ph - kh) // sh + 1
        OW = (W + 2 * pw - kw) // sw + 1
        y = torch.empty((*xc.shape[:-3], OD, OH, OW), dtype=xc.dtype, device=xc.device)
        planes = xc.numel() // (D * H * W) if D * H * W else 0
        if y.numel():
            grid = (planes * OD, triton.cdiv(OH * OW, _BLOCK))
            _avgpool3d_kernel[grid](xc, y, D, H, W, OD, OH, OW, kd, kh, kw, sd, sh, sw, pd, ph, pw,
                                    1.0 / (kd * kh * kw), BLOCK=_BLOCK, num_warps=4)
        return y
