"""Op names from other tools -> opscope op names (DESIGN.md: short, lower-case, the same everywhere)."""
from __future__ import annotations


# ONNX operator types -> opscope ops; types not here keep their ONNX name
ONNX_OPS = {"Gemm": "linear", "MatMul": "matmul", "Conv": "convolution", "Relu": "relu", "Gelu": "gelu",
            "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Sqrt": "sqrt", "Exp": "exp",
            "Erf": "erf", "Tanh": "tanh", "Sigmoid": "sigmoid", "Softmax": "softmax", "LogSoftmax": "log_softmax",
            "LayerNormalization": "layer_norm", "BatchNormalization": "batch_norm", "Transpose": "permute",
            "Concat": "cat", "MaxPool": "max_pool2d", "AveragePool": "avg_pool2d",
            "GlobalAveragePool": "adaptive_avg_pool2d", "ReduceMean": "mean", "ReduceSum": "sum",
            "Where": "where", "Flatten": "flatten", "Neg": "neg", "Abs": "abs", "Reciprocal": "reciprocal",
            "Cast": "to", "Expand": "expand", "Slice": "slice", "Split": "split", "Gather": "index_select"}


def op_for_aten_name(name: str) -> str:
    """`aten::linear` -> `linear` (the ATen packet `aten.linear` in the op registry); unknown names stay."""
    if name.startswith("aten::"):
        from opscope.runtime.ops import registry     # here: it imports torch, which an opscope export never needs
        packet = "aten." + name[6:].split(".", 1)[0]
        op = registry._ATEN.get(packet)
        if op is not None:
            return op
    return name


def op_for_onnx(op_type: str) -> str:
    from opscope.runtime.ops import registry
    op = ONNX_OPS.get(op_type)
    return op if op is not None and op in registry.OPS else op_type
