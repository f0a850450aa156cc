"""One generated Python function per fused node, for numpy-style backends.

    kernel = fused_numpy_kernel(node, kernel_of)     # kernel_of(member) -> its reference kernel

Members that are plain ufuncs (add, mul, relu, exp, ...) write into buffers allocated once, when
the plan is made; the others call their reference kernel. Values that leave the kernel are new
arrays on every call (the caller may keep them past the next run), so only intermediates reuse
buffers.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import to_numpy
from ..graph import Ref

# op -> (numpy ufunc expression, number of operands)
UFUNCS = {"add": ("_np.add", 2), "sub": ("_np.subtract", 2), "mul": ("_np.multiply", 2),
          "div": ("_np.true_divide", 2), "maximum": ("_np.maximum", 2), "minimum": ("_np.minimum", 2),
          "neg": ("_np.negative", 1), "abs": ("_np.absolute", 1), "exp": ("_np.exp", 1), "log": ("_np.log", 1),
          "sqrt": ("_np.sqrt", 1), "tanh": ("_np.tanh", 1), "sin": ("_np.sin", 1), "cos": ("_np.cos", 1),
          "eq": ("_np.equal", 2), "ne": ("_np.not_equal", 2), "lt": ("_np.less", 2), "le": ("_np.less_equal", 2),
          "gt": ("_np.greater", 2), "ge": ("_np.greater_equal", 2), "relu": ("_np.maximum", 1)}


def _ufunc_ok(m) -> bool:
    if m.op not in UFUNCS or m.kwargs or len(m.args) != UFUNCS[m.op][1] or m.attrs.get("layout"):
        return False
    if any(k in m.attrs and m.attrs[k] not in (None, 1) for k in ("alpha", "rounding_mode")):
        return False
    return all(isinstance(a, Ref) or (type(a) in (int, float, bool)) for a in m.args) and \
        m.output_meta[0] is not None and m.output_meta[0].dtype in ("float32", "float64", "float16", "bool")


def fused_numpy_kernel(node, kernel_of):
    from .fuse import members
    ms = members(node)
    ns: dict = {"_np": np}
    names = {s: f"x{i}" for i, s in enumerate(node.inputs)}
    lines = [f"def fused_kernel({', '.join(names[s] for s in node.inputs)}):"]
    consts = []

    def expr(v):
        if isinstance(v, Ref):
            return names[v.slot]
        if isinstance(v, list):
            return "[" + ", ".join(expr(x) for x in v) + "]"
        if isinstance(v, tuple):
            return "(" + "".join(expr(x) + ", " for x in v) + ")"
        if v is None or type(v) in (bool, int) or (type(v) is float and np.isfinite(v)):
            return repr(v)
        consts.append(v)
        ns[f"_c{len(consts) - 1}"] = v
        return f"_c{len(consts) - 1}"

    leaving = set(node.outputs)
    for i, m in enumerate(ms):
        out = m.outputs[0]
        var = f"t{i}"
        if _ufunc_ok(m):
            fn, _ = UFUNCS[m.op]
            operands = [expr(a) for a in m.args] + (["0"] if m.op == "relu" else [])
            meta = m.output_meta[0]
            if out in leaving:
                target = f"_np.empty({tuple(meta.shape)!r}, dtype=_d{i})"
            else:           # an intermediate: its buffer is allocated once, with the kernel
                ns[f"_b{i}"] = np.empty(meta.shape, dtype=to_numpy(meta.dtype))
                target = f"_b{i}"
            ns[f"_d{i}"] = to_numpy(meta.dtype)
            lines.append(f"    {var} = {fn}({', '.join(operands)}, out={target}, casting='unsafe')")
        else:
            ns[f"_k{i}"] = kernel_of(m)
            args = ", ".join([expr(a) for a in m.args] + [f"{k}={expr(v)}" for k, v in m.kwargs.items()])
            lines.append(f"    {var} = _k{i}({args})")
        names[out] = var
    rets = [names[s] for s in node.outputs]
    lines.append(f"    return [{', '.join(rets)}]" if node.multi_output else f"    return {rets[0]}")
    source = "\n".join(lines)
    exec(compile(source, f"<fused kernel {node.name}>", "exec"), ns)     # noqa: S102 -- our own generated code
    kernel = ns["fused_kernel"]
    kernel.source = source
    return kernel
