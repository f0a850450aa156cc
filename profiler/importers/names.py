"""Op names from other tools -> opscope op names (DESIGN.md: short, lower-case, the same everywhere)."""
from __future__ import annotations

import sys


# ONNX operator types -> opscope ops; types not here keep their ONNX name
ONNX_OPS = {"Gemm": "linear", "MatMul": "matmul", "Conv": "convolution", "Relu": "relu", "Gelu": "gelu",
            "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Sqrt": "sqrt", "Exp": "exp",
            "Erf": "erf", "Tanh": "tanh", "Sigmoid": "sigmoid", "Softmax": "softmax", "LogSoftmax": "log_softmax",
            "LayerNormalization": "layer_norm", "BatchNormalization": "batch_norm", "Transpose": "permute",
            "Concat": "cat", "MaxPool": "max_pool2d", "AveragePool": "avg_pool2d",
            "GlobalAveragePool": "adaptive_avg_pool2d", "ReduceMean": "mean", "ReduceSum": "sum",
            "Where": "where", "Flatten": "flatten", "Neg": "neg", "Abs": "abs", "Reciprocal": "reciprocal",
            "Cast": "to", "Expand": "expand", "Slice": "slice", "Split": "split", "Gather": "index_select"}


def _aten() -> dict[str, str]:
    """The registry's ATen map where this process has the registry (it may hold ops a plugin added), else
    the written-out copy: the registry imports torch, and importing torch in the middle of a parse is slow
    twice over (1.2 s, and an exception torch's import keeps in a cycle holds every frame of the parse --
    a million events -- until a full garbage collection)."""
    registry = sys.modules.get("opscope.runtime.ops.registry")
    if registry is not None:
        return registry._ATEN
    from .aten_table import ATEN
    return ATEN


# ATen ops the registry runs as another op (an uninitialized `empty` is made as `zeros`): the op grouping of a
# trace names what the trace ran, not how opscope would run it
_OWN_OP = {"aten.empty": "empty", "aten.empty_like": "empty_like", "aten.empty_strided": "empty_strided",
           "aten.new_empty": "new_empty", "aten.new_empty_strided": "new_empty_strided"}


def op_for_aten_name(name: str) -> str:
    """`aten::linear` -> `linear` (the ATen packet `aten.linear` in the op registry); unknown names stay."""
    if name.startswith("aten::"):
        packet = "aten." + name[6:].split(".", 1)[0]
        op = _OWN_OP.get(packet) or _aten().get(packet)
        if op is not None:
            return op
    return name


def aten_table_source() -> str:
    """aten_table.py's text, from the registry."""
    from opscope.runtime.ops import registry
    head = ('"""ATen packet -> opscope op, as the op registry maps them, written out so that importing a trace never\n'
            'imports torch (the registry does; 1.2 s of a `trace import`). Generated -- do not edit by hand:\n\n'
            '    python -c "from opscope.profiler.importers import names; print(names.aten_table_source(), end=\'\')" \\\n'
            '        > profiler/importers/aten_table.py\n\n'
            'tests/test_trace_import.py checks it against the registry of a fresh process."""\n\n'
            'ATEN: dict[str, str] = {\n')
    return head + "".join(f"    {k!r}: {v!r},\n" for k, v in sorted(registry._ATEN.items())) + "}\n"


def op_for_onnx(op_type: str) -> str:
    """`Gemm` -> `linear`; unknown types keep their ONNX name. Every op ONNX_OPS names is an op of the registry
    (tests/test_trace_import.py checks it), so importing a profile never loads the registry, nor torch."""
    return ONNX_OPS.get(op_type, op_type)
