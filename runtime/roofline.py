"""The roofline time model: how long an op takes on a described chip.

One function serves the sim backend's clock, the advisor's what-if estimates and the
roofline chart, so the three can never disagree.
"""
from __future__ import annotations

from .description import Description
from .dtypes import FLOATS


def op_seconds(flops: int, nbytes: int, dtype: str, d: Description, *, transfer: bool = False) -> float:
    if transfer:
        bw = d.host_bandwidth or d.memory_bandwidth or 1e10
        return nbytes / bw + d.launch_overhead
    peak = d.peak(dtype)
    compute = flops / peak if peak else 0.0
    memory = nbytes / d.memory_bandwidth if d.memory_bandwidth else 0.0
    return max(compute, memory) + d.launch_overhead


def node_dtype(node) -> str:
    """The dtype an op computes in: its first floating input, else its first output."""
    for m in node.input_meta:
        if m is not None and m.dtype in FLOATS:
            return m.dtype
    for m in node.output_meta:
        if m is not None:
            return m.dtype
    return "float32"


def node_seconds(node, d: Description) -> float:
    from .ops import OPS
    opdef = OPS.get(node.op)
    if opdef is not None and opdef.kind == "view":
        return 0.0          # a view is metadata: no kernel launches, no bytes move
    return op_seconds(node.flops, node.bytes_moved, node_dtype(node), d, transfer=node.op == "transfer")


def bound(flops: int, nbytes: int, dtype: str, d: Description) -> str:
    """compute, memory, or overhead: which term of the model dominates."""
    peak = d.peak(dtype)
    compute = flops / peak if peak else 0.0
    memory = nbytes / d.memory_bandwidth if d.memory_bandwidth else 0.0
    if d.launch_overhead > max(compute, memory):
        return "overhead"
    return "compute" if compute >= memory else "memory"
