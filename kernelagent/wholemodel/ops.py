"""What each ATen op is, for grouping a model's graph into regions (no torch import here).

An op's name is its overload packet's name as torch.export writes it (`linear`, `relu`,
`_softmax`, `layer_norm`). Anchors are the ops that hold most of a model's FLOPs; fusable ops
are elementwise, norms and reductions that a kernel can apply in the same pass as its
neighbours; views move no data.
"""

from __future__ import annotations

ANCHORS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "_convolution", "einsum",
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
})
ELEMENTWISE = frozenset({
    "relu", "relu_", "gelu", "silu", "sigmoid", "tanh", "exp", "log", "neg", "abs", "sqrt", "rsqrt", "pow",
    "add", "sub", "mul", "div", "maximum", "minimum", "clamp", "clamp_min", "clamp_max", "hardtanh",
    "leaky_relu", "elu", "selu", "celu", "softplus", "hardswish", "hardsigmoid", "mish", "erf", "where",
    "dropout", "native_dropout", "reciprocal", "square", "sign", "masked_fill", "threshold", "log1p", "expm1",
    "prelu", "rsub", "floor", "ceil", "round", "fmod", "remainder", "logical_not", "eq", "ne", "gt", "lt",
    "ge", "le", "alias", "clone", "_to_copy", "to", "type_as", "glu", "addcmul", "addcdiv", "lerp",
})
NORMS = frozenset({
    "layer_norm", "native_layer_norm", "batch_norm", "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit_functional", "group_norm", "native_group_norm", "instance_norm", "rms_norm",
    "_fused_rms_norm", "softmax", "_softmax", "log_softmax", "_log_softmax", "normalize",
})
REDUCTIONS = frozenset({
    "sum", "mean", "amax", "amin", "max", "min", "var", "std", "var_mean", "norm", "linalg_vector_norm",
    "logsumexp", "prod", "argmax", "argmin", "cumsum", "cumprod", "avg_pool1d", "avg_pool2d", "avg_pool3d",
    "max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "adaptive_avg_pool1d",
    "adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool2d", "adaptive_max_pool2d",
})
VIEWS = frozenset({
    "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "unsqueeze", "squeeze",
    "flatten", "unflatten", "contiguous", "slice", "select", "split", "split_with_sizes", "chunk",
    "unbind", "getitem", "detach", "narrow", "as_strided", "repeat", "cat", "stack", "movedim",
    "view_as", "expand_as", "transpose_", "pad", "constant_pad_nd",
})


def kind(op: str) -> str:
    """anchor | elementwise | norm | reduction | view | other."""
    if op in ANCHORS:
        return "anchor"
    if op in NORMS:
        return "norm"
    if op in REDUCTIONS:
        return "reduction"
    if op in VIEWS:
        return "view"
    if op in ELEMENTWISE:
        return "elementwise"
    return "other"


def fusable(op_kind: str) -> bool:
    """Can join a region after its anchor (an epilogue) or a chain of its own."""
    return op_kind in ("elementwise", "norm", "reduction", "view")
