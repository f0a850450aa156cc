"""The operator registry: one OpDef per hardware-agnostic op.

An op is specified once: its name, the ATen overload packets capture maps to it, its kind,
the dtypes it is defined for, a numpy reference kernel (aten-style signature, arrays in place
of tensors), and a cost model. Shape and dtype inference run the op's torch implementation on
meta tensors, so every op -- built-in or user-defined with `@operator` -- infers the same way
the model it came from does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..dtypes import FLOATS

ALL_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16", "int64", "int32",
                        "int16", "int8", "uint8", "bool"})
COMPLEX = frozenset({"complex64", "complex128"})
NO_NUMPY = frozenset({"complex32", "float8_e4m3fn", "float8_e5m2"})   # dtypes torch has and numpy does not

# kind -> default FLOPs per output element (views and copies move bytes, compute nothing)
_KIND_FLOPS = {"elementwise": 1, "activation": 4, "reduction": 1, "view": 0, "copy": 0,
               "creation": 0, "compute": 0, "normalization": 5, "custom": 0}


@dataclass
class OpDef:
    name: str
    kind: str
    numpy: Callable | None
    aten: tuple[str, ...] = ()
    flops: Callable | None = None       # flops(node) -> int; default: per-element by kind
    dtypes: frozenset = ALL_DTYPES
    doc: str = ""
    torch: Callable | None = None       # for user ops: the torch implementation
    composite: Callable | None = None   # for user ops written in terms of other ops
    extra: dict = field(default_factory=dict)
    # accepts(node) -> True | "why not": the reference kernel cannot take this node's arguments
    # (placement then sends the node to a fallback instead of letting the kernel raise)
    accepts: Callable | None = None


OPS: dict[str, OpDef] = {}
_ATEN: dict[str, str] = {}
# Nodes opscope inserts into a plan, never a model's ops: placement's copies between backends, the fuse
# pass's fused chains, the layout pass's relayouts, placement's compiler-stack regions (runtime/regions.py).
# Conformance and `opscope ops` leave them out; the passes' (and regions') own tests check them.
INTERNAL_OPS = frozenset({"transfer", "fused", "relayout", "region"})


def define(name: str, kind: str, aten=(), flops=None, dtypes=ALL_DTYPES, doc="", accepts=None):
    """Register the decorated numpy function as the reference kernel of op `name`."""

    def wrap(fn):
        OPS[name] = OpDef(name, kind, fn, tuple(aten), flops, frozenset(dtypes), doc or (fn.__doc__ or "").strip(),
                          accepts=accepts)
        for packet in aten:
            _ATEN[packet] = name
        return fn

    return wrap


def composition(name: str, kind: str, aten=(), flops=None, dtypes=ALL_DTYPES, doc=""):
    """Register the decorated torch function (the ATen op's signature, written in other ATen ops) as
    op `name`'s definition: a backend with no kernel of its own runs its decomposition -- the body
    captured into opscope ops (runtime/decompose.py) -- so one definition serves every backend."""

    def wrap(fn):
        OPS[name] = OpDef(name, kind, None, tuple(aten), flops, frozenset(dtypes), doc or (fn.__doc__ or "").strip(),
                          torch=fn, composite=fn)
        for packet in aten:
            _ATEN[packet] = name
        return fn

    return wrap


def alias(name: str, *packets: str) -> None:
    """More ATen packets that mean op `name` (e.g. in-place and out-of-place spellings)."""
    for packet in packets:
        _ATEN[packet] = name
        OPS[name].aten += (packet,)


def op_for_target(target) -> str | None:
    """opscope op name for a captured ATen overload (`aten.linear.default` -> `linear`)."""
    packet = getattr(target, "overloadpacket", None)
    key = str(packet) if packet is not None else getattr(target, "__name__", str(target))
    if key in _ATEN:
        return _ATEN[key]
    # opscope::NAME custom ops registered by @operator
    if key.startswith("opscope.") and key.split(".", 1)[1] in OPS:
        return key.split(".", 1)[1]
    return None


def accepts(node) -> bool | str:
    """True when the op's reference kernel takes this node's arguments, else why not."""
    for m in (*node.input_meta, *node.output_meta):
        if m is not None and m.dtype in NO_NUMPY:      # nothing to hold the values in: torch runs it
            return f"{node.op}: numpy has no {m.dtype}"
    op = OPS.get(node.op)
    check = getattr(op, "accepts", None)
    if check is None:
        return True
    try:
        return check(node)
    except Exception as e:  # a check that cannot read the node refuses it rather than guessing
        return f"{node.op}: cannot check its arguments ({type(e).__name__}: {e})"


def arg(node, i: int, name: str, default=None):
    """Argument `name` (position i) of a node, wherever capture put it; tensors stay Refs."""
    if name in node.kwargs:
        return node.kwargs[name]
    if len(node.args) > i:
        return node.args[i]
    return node.attrs.get(name, default)


def flops_of(node) -> int:
    op = OPS.get(node.op)
    if op is not None and op.flops is not None:
        return int(op.flops(node))
    per = _KIND_FLOPS.get(op.kind if op else "custom", 1)
    out = sum(m.numel for m in node.output_meta if m is not None)
    return per * out


def members_flops(node) -> int:
    """The cost of a node that stands for others (a fused node, a compiler-stack region): its members' sum."""
    return sum(flops_of(m) for m in node.attrs.get("members", ()))


def bytes_of(node) -> int:
    """Bytes read and written; views alias their input and move nothing."""
    op = OPS.get(node.op)
    if op is not None and op.kind in ("view",):
        return 0
    if node.op == "transfer":     # one copy crosses the link
        return sum(m.nbytes for m in node.input_meta)
    return sum(m.nbytes for m in node.input_meta) + sum(m.nbytes for m in node.output_meta if m is not None)
