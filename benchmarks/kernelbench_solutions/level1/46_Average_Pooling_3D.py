"""KernelBench level1/46_Average_Pooling_3D: nn.AvgPool3d (count_include_pad, floor mode) in Triton.

A program computes BLOCK_W outputs along the last dim for one (sample, channel, od, oh),
summing the kd x kh x kw window with masked loads (zero padding counts, as in PyTorch's
default). Any kernel size, stride and padding (ints or triples) and any input size.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

_BLOCK_W = 128


@triton.jit
def _avgpool3d_kernel(x_ptr, y_ptr, D, H, W, OD, OH, OW, KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
                      SD, SH, SW, PD, PH, PW, inv_vol, BLOCK_W: tl.constexpr):
    line = tl.program_id(0).to(tl.int64)  # ((n * C + c) * OD + od) * OH + oh
    oh = line % OH
    od = (line // OH) % OD
    plane = line // (OH * OD)
    ow = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    out_mask = ow < OW
    x_vol = x_ptr + plane * D * H * W
    acc = tl.zeros((BLOCK_W,), dtype=tl.float32)
    # Row indices as vectors like ow (folded by the compiler): the interpreter cannot AND a
    # scalar condition into a block mask.
    d0 = od * SD - PD + ow * 0
    h0 = oh * SH - PH + ow * 0
    w0 = ow * SW - PW
    for kd in tl.static_range(KD):
        d = d0 + kd
        d_ok = (d >= 0) & (d < D)
        for kh in tl.static_range(KH):
            h = h0 + kh
            dh_ok = d_ok & (h >= 0) & (h < H)
            for kw in tl.static_range(KW):
                w = w0 + kw
                m = out_mask & dh_ok & (w >= 0) & (w < W)
                acc += tl.load(x_vol + (d * H + h) * W + w, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + line * OW + ow, (acc * inv_vol).to(y_ptr.dtype.element_ty), mask=out_mask)


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
            grid = (planes * OD * OH, triton.cdiv(OW, _BLOCK_W))
            _avgpool3d_kernel[grid](xc, y, D, H, W, OD, OH, OW, kd, kh, kw, sd, sh, sw, pd, ph, pw,
                                    1.0 / (kd * kh * kw), BLOCK_W=_BLOCK_W, num_warps=4)
        return y
