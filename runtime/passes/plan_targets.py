"""How a plan names a node's kernel, and the only way a name becomes a kernel again: a table lookup.

    name = target_name(node)                  # "aten::linear.default", "$fused", {"$nhwc": ...}, None
    node.target = kernel_for(name, node)      # UsageError for anything not in the table

A plan is data from someone else. A name in it is looked up in a fixed table of what opscope knows --
the ATen packets opscope's op registry maps (`aten.linear` -> `linear`) and opscope's own custom ops
(`opscope::sgd`, a user's `@operator` registered in this process) -- and must agree with the node's
op. Nothing in a plan is ever walked as an attribute path: `torch.ops.import_module`,
`torch.ops.load_library` and every other object reachable from `torch.ops` are not in the table.
"""
from __future__ import annotations

import re

import torch

from ..errors import UsageError, first_line

# ns::name.overload, each part an identifier: what torch's own schema names look like
_NAME = re.compile(r"^(aten|opscope)::([A-Za-z_][A-Za-z0-9_]{0,127})\.([A-Za-z_][A-Za-z0-9_]{0,63})$")
_INTERNAL = {"$fused": "fused", "$relayout": "relayout"}    # kernels the passes make, by the op they serve


def known_packets() -> dict[str, str]:
    """ATen packet -> opscope op, as the op registry maps them (`aten.add_` -> `add`)."""
    from ..ops import OPS
    return {p: name for name, d in OPS.items() for p in d.aten}


def target_name(node):
    """What a plan writes for node.target; UsageError (at save) for a kernel a plan cannot name."""
    from .fuse import FusedCall
    from .layout import LayoutCall, relayout_torch
    t = node.target
    if t is None:
        return None
    if isinstance(t, FusedCall):
        return "$fused"
    if t is relayout_torch:
        return "$relayout"
    if isinstance(t, LayoutCall):
        return {"$nhwc": _overload_name(t.kernel, node)}
    return _overload_name(t, node)


def _overload_name(t, node) -> str:
    name = f"{t._schema.name}.{t._overloadname}" if isinstance(t, torch._ops.OpOverload) else None
    if name is None or _lookup(name, node.op) is None:
        raise UsageError(f"cannot save node {node.name} in a plan: its kernel {first_line(repr(t))[:60]} (op "
                         f"{node.op}) is not an op opscope knows; run the model without a plan")
    return name


def kernel_for(name, node, where: str = "plan"):
    """The kernel a plan's `name` stands for at `node`; UsageError naming the node for anything else."""
    from .fuse import FusedCall
    from .layout import LayoutCall, relayout_torch
    if name is None:
        return None
    if isinstance(name, str) and name in _INTERNAL:
        if node.op != _INTERNAL[name]:
            raise _refuse(where, node, name)
        return FusedCall(node) if name == "$fused" else relayout_torch
    if isinstance(name, dict) and list(name) == ["$nhwc"]:
        positions = node.attrs.get("nhwc_args")
        if not (isinstance(positions, list) and all(type(i) is int and 0 <= i < len(node.args) for i in positions)):
            raise UsageError(f"{where}: node {_shown(node.name)} has bad nhwc_args; compile the plan again")
        return LayoutCall(kernel_for(name["$nhwc"], node, where), positions)
    kernel = _lookup(name, node.op) if isinstance(name, str) else None
    if kernel is None:
        raise _refuse(where, node, name)
    return kernel


def _refuse(where, node, name) -> UsageError:
    return UsageError(f"{where}: node {_shown(node.name)} (op {_shown(node.op)}) names kernel {_shown(name)}, "
                      "which is not an op opscope knows; a plan names only opscope's ops -- compile it again "
                      "with `opscope compile`")


def _shown(v) -> str:
    return ascii(v)[:80]


def _lookup(name: str, op: str):
    m = _NAME.match(name)
    if m is None:
        return None
    ns, packet, overload = m.groups()
    if ns == "aten":
        if known_packets().get(f"aten.{packet}") != op:
            return None
    else:
        from ..ops.registry import INTERNAL_OPS, OPS
        if packet != op or packet not in OPS or packet in INTERNAL_OPS:
            return None
    return _overload(ns, packet, overload)


_FOUND: dict = {}      # hits only: an @operator defined later in this process is found then


def _overload(ns: str, packet: str, overload: str):
    # ns and packet are now names from opscope's own registry (checked above); the overload must be one
    # torch lists for that packet. Only then are they looked up in torch.ops.
    if (ns, packet, overload) in _FOUND:
        return _FOUND[ns, packet, overload]
    namespace = torch.ops.aten if ns == "aten" else torch.ops.opscope
    try:
        p = getattr(namespace, packet)
    except (AttributeError, RuntimeError):       # an @operator this process has not defined
        return None
    if not isinstance(p, torch._ops.OpOverloadPacket) or overload not in p.overloads():
        return None
    k = getattr(p, overload)
    if not isinstance(k, torch._ops.OpOverload):
        return None
    _FOUND[ns, packet, overload] = k
    return k
