"""Placement: which backend runs each node, and the transfers between them.

Like ONNX Runtime's partitioning: the chosen backend claims every node its registry supports;
the rest go to its fallback, with explicit `transfer` nodes where a value crosses backends.
The result is a report a user can read.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import UnsupportedOpError
from .graph import Graph, Node, Ref, TensorMeta
from .hdi import Backend
from .ops import OPS
from .ops.registry import define

define("transfer", "transfer", doc="copy a value between backends (inserted by placement)")(lambda x: x)


@dataclass
class Placement:
    assignments: list[tuple[Node, Backend]]          # in execution order, transfers included
    unsupported: dict[str, list[str]] = field(default_factory=dict)   # op -> node names
    reasons: dict[str, str] = field(default_factory=dict)            # op -> why the backend refused it
    transfer_bytes: int = 0
    transfers: int = 0

    def report(self) -> dict:
        per_backend: dict[str, int] = {}
        fell_back: dict[str, dict] = {}
        primary = self.assignments[0][1].name if self.assignments else ""
        for node, b in self.assignments:
            if node.op == "transfer":
                continue
            per_backend[b.name] = per_backend.get(b.name, 0) + 1
            if b.name != primary and b is not None and getattr(node, "fallback", False):
                f = fell_back.setdefault(node.op, {"op": node.op, "nodes": 0, "backend": b.name,
                                                   "reason": self.reasons.get(node.op, "")})
                f["nodes"] += 1
        return {"nodes_per_backend": per_backend, "fallback_ops": sorted(fell_back.values(), key=lambda r: r["op"]),
                "transfers": self.transfers, "transfer_bytes": self.transfer_bytes}


def place(graph: Graph, backend: Backend, *, allow_fallback: bool = True) -> Placement:
    where: dict[int, Backend] = {}     # slot -> backend holding it (None: a constant, anywhere)
    moved: dict[tuple[int, str], int] = {}
    out: list[tuple[Node, Backend]] = []
    unsupported: dict[str, list[str]] = {}
    reasons: dict[str, str] = {}
    next_slot = [graph.num_slots]
    placement = Placement(out)
    for s in graph.input_slots:
        where[s] = backend

    for node in graph.nodes:
        ok = backend.ops.supports(node)
        target = backend
        node.fallback = False
        if ok is not True:
            reasons.setdefault(node.op, ok)
            fb = backend.fallback
            if allow_fallback and fb is not None and fb.ops.supports(node) is True:
                target = fb
                node.fallback = True
            else:
                unsupported.setdefault(node.op, []).append(node.name)
                continue
        # Values produced on another backend travel through an explicit transfer node.
        remap = {}
        for s in node.inputs:
            src = where.get(s)
            if src is None or src is target:
                continue
            key = (s, target.name)
            if key not in moved:
                meta = graph.slot_meta.get(s) or TensorMeta((), "float32")
                t = next_slot[0]
                next_slot[0] += 1
                graph.slot_meta[t] = meta
                tr = Node(index=-1, name=f"transfer_{node.name}_{s}", op="transfer", target=None, args=(Ref(s),),
                          kwargs={}, inputs=[s], outputs=[t], input_meta=[meta], output_meta=[meta],
                          attrs={"src": src.name, "dst": target.name}, module_path=node.module_path,
                          module_type=node.module_type, source=node.source, source_line=node.source_line)
                tr.fallback = target is not backend
                tr.src_backend = src
                out.append((tr, target))
                moved[key] = t
                placement.transfers += 1
                placement.transfer_bytes += meta.nbytes
                where[t] = target
            remap[s] = moved[key]
        if remap:
            node = _rewired(node, remap)
        out.append((node, target))
        for s in node.outputs:
            where[s] = target
    placement.unsupported = unsupported
    placement.reasons = reasons
    graph.num_slots = next_slot[0]
    if unsupported:
        listing = ", ".join(f"{op} (node {n[0]}" + (f" and {len(n) - 1} more)" if len(n) > 1 else ")")
                            for op, n in sorted(unsupported.items()))
        how = "run without --no-fallback" if backend.fallback is not None and not allow_fallback else \
            "give the backend a fallback in its description"
        raise UnsupportedOpError(f"backend {backend.name} cannot run {listing}; {how}", sorted(unsupported))
    return placement


def _rewired(node: Node, remap: dict[int, int]) -> Node:
    import copy

    def sub(a):
        if isinstance(a, Ref):
            return Ref(remap.get(a.slot, a.slot))
        if isinstance(a, (list, tuple)):
            return type(a)(sub(x) for x in a)
        return a

    n = copy.copy(node)
    n.args = sub(node.args)
    n.kwargs = {k: sub(v) for k, v in node.kwargs.items()}
    n.inputs = [remap.get(s, s) for s in node.inputs]
    return n
