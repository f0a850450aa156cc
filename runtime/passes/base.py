"""What every pass shares: the Pass record, the context it runs in, the log it writes, and the
few graph edits passes make (who reads a slot, replace a slot, drop nodes).

A pass is a module with one `PASS = Pass(name, requires, run)`; `run(graph, ctx)` edits the
graph it is given (the pipeline hands it a copy) and returns one line per change.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable

from ..graph import Graph, Node, Ref
from ..ops import OPS


@dataclass(frozen=True)
class Pass:
    name: str
    requires: tuple            # description fields the pass reads, e.g. ("hardware.preferred_layout",)
    run: Callable              # run(graph, ctx) -> list[str], one line per change
    doc: str = ""


@dataclass
class Context:
    """What a pass may ask: the backend (its description, which ops it runs) and which slots
    must keep their identity (graph outputs, values carried to the next training step)."""

    backend: object
    protected: set = field(default_factory=set)
    volatile: set = field(default_factory=set)      # constant slots whose value changes between runs
    options: dict = field(default_factory=dict)     # per-pass overrides (tests: {"layout": "nhwc"})

    @property
    def description(self):
        return self.backend.description

    def supports(self, node: Node) -> bool:
        """Whether the backend itself (not a fallback) runs `node`."""
        try:
            return self.backend.ops.supports(node) is True
        except Exception:        # a registry that cannot judge a node does not get it fused
            return False


@dataclass
class PassLog:
    """What each pass changed, in order: [{"pass", "changes": [...], "nodes_before", "nodes_after"}]."""

    entries: list = field(default_factory=list)

    def add(self, name: str, changes: list[str], before: int, after: int, **extra) -> None:
        self.entries.append({"pass": name, "changes": list(changes), "nodes_before": before, "nodes_after": after,
                             **extra})

    def names(self) -> list[str]:
        return [e["pass"] for e in self.entries]

    def summary(self) -> str:
        return "; ".join(f"{e['pass']}: {len(e['changes'])} change(s)" for e in self.entries) or "no passes"


def copy_graph(graph: Graph) -> Graph:
    """A graph passes may edit: nodes and dicts copied, constant tensors shared."""
    nodes = []
    for n in graph.nodes:
        c = copy.copy(n)
        c.attrs = dict(n.attrs)
        c.inputs, c.outputs = list(n.inputs), list(n.outputs)
        c.input_meta, c.output_meta = list(n.input_meta), list(n.output_meta)
        c.kwargs = dict(n.kwargs)
        nodes.append(c)
    return Graph(nodes=nodes, num_slots=graph.num_slots, input_slots=list(graph.input_slots),
                 constant_slots=dict(graph.constant_slots), output_refs=list(graph.output_refs),
                 slot_meta=dict(graph.slot_meta), model_name=graph.model_name)


def output_slots(graph: Graph) -> set:
    return {r.slot for r in _refs(graph.output_refs)}


def _refs(v):
    if isinstance(v, Ref):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _refs(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _refs(x)


def readers(graph: Graph) -> dict[int, list[Node]]:
    """slot -> the nodes that read it, in order."""
    out: dict[int, list[Node]] = {}
    for n in graph.nodes:
        for s in dict.fromkeys(n.inputs):
            out.setdefault(s, []).append(n)
    return out


def substitute(v, remap: dict):
    """`v` with every Ref to a slot in `remap` pointing at its replacement."""
    if isinstance(v, Ref):
        return Ref(remap.get(v.slot, v.slot))
    if isinstance(v, list):
        return [substitute(x, remap) for x in v]
    if isinstance(v, tuple):
        return tuple(substitute(x, remap) for x in v)
    if isinstance(v, dict):
        return {k: substitute(x, remap) for k, x in v.items()}
    return v


def replace_uses(graph: Graph, remap: dict, start: int = 0) -> None:
    """Every read of slot `old` (from node `start` on, and the graph's outputs) reads `remap[old]`."""
    for n in graph.nodes[start:]:
        if any(s in remap for s in n.inputs):
            n.args = substitute(n.args, remap)
            n.kwargs = substitute(n.kwargs, remap)
            n.inputs = [remap.get(s, s) for s in n.inputs]
    graph.output_refs = substitute(graph.output_refs, remap)


def renumber(graph: Graph) -> None:
    for i, n in enumerate(graph.nodes):
        n.index = i


def is_inplace(node: Node) -> bool:
    """An ATen in-place op (`add_`) mutates its first argument: passes leave it and its inputs alone."""
    packet = str(getattr(node.target, "overloadpacket", "") or "")
    return packet.endswith("_") and not packet.endswith("__")


RANDOM_OPS = frozenset({"rand", "randn", "randperm", "rand_like", "randn_like", "bernoulli", "dropout",
                        "feature_dropout", "alpha_dropout", "feature_alpha_dropout", "native_dropout"})


def pure(node: Node) -> bool:
    """Same inputs, same outputs, nothing else touched: what CSE, folding and DCE may rely on."""
    return node.op not in RANDOM_OPS and not is_inplace(node) and node.op != "transfer" and \
        not node.op.startswith(("aten:", "python:")) and ":" not in node.op and \
        node.attrs.get("phase") != "optimizer"


# kinds whose ops compute each output element from the same element of their inputs
_POINTWISE_KINDS = ("elementwise", "activation")
_NOT_POINTWISE = frozenset({"upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d", "grid_sampler_2d",
                            "diff", "sgd", "adamw", "nll_loss_backward", "mse_loss_backward"})


def pointwise(node: Node) -> bool:
    op = OPS.get(node.op)
    if op is None or node.multi_output or len(node.outputs) != 1 or node.output_meta[0] is None:
        return False
    if node.op == "batch_norm":      # inference batch norm is a per-channel affine map
        return node.attrs.get("training") is False
    if op.kind not in _POINTWISE_KINDS or node.op in _NOT_POINTWISE:
        return False
    out = node.output_meta[0].shape
    return all(m is not None and len(m.shape) <= len(out) for m in node.input_meta)
