"""layout: on a chip that prefers NHWC (`preferred_layout = "nhwc"`), convolutions and the ops
around them (pointwise ops, inference batch norm, 2-d pooling) run on NHWC values, with one
transpose where a value enters the region and one where it leaves -- not two per convolution.

Regions grow from each convolution through its neighbours that can run in either layout, so a
ResNet body becomes one region with transposes at the stem and at the pooled head. Region nodes
carry attrs["layout"] = "nhwc"; their kernels see NCHW views (free on numpy, channels-last on
torch), so any backend runs them unchanged while the values between them stay NHWC.
"""
from __future__ import annotations

import torch

from ..graph import Node, Ref, TensorMeta
from .base import Context, Pass, output_slots, pointwise, readers, renumber
from ..ops.registry import define

CONVS = frozenset({"conv2d", "convolution"})
_FIRST_ARG = CONVS | {"batch_norm", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"}
TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def nhwc(meta: TensorMeta) -> TensorMeta:
    n, c, h, w = meta.shape
    return TensorMeta((n, h, w, c), meta.dtype)


def _rank4(graph, s) -> bool:
    m = graph.slot_meta.get(s)
    return m is not None and len(m.shape) == 4


def activation_args(node: Node, graph) -> list[int]:
    """Positions of the args that carry the image (NCHW activations), for a node that can run in NHWC."""
    if node.op in _FIRST_ARG:
        return [0] if node.args and isinstance(node.args[0], Ref) and _rank4(graph, node.args[0].slot) else []
    return [i for i, a in enumerate(node.args) if isinstance(a, Ref) and _rank4(graph, a.slot)]


def capable(node: Node, graph, ctx: Context) -> bool:
    if node.multi_output or len(node.outputs) != 1 or not _rank4(graph, node.outputs[0]) or node.kwargs:
        return False
    if not isinstance(node.target, torch._ops.OpOverload) or not ctx.supports(node):
        return False
    if node.op in CONVS:
        return len(node.args) > 1 and isinstance(node.args[1], Ref) and _rank4(graph, node.args[1].slot)
    return (node.op in _FIRST_ARG or pointwise(node)) and bool(activation_args(node, graph))


def run(graph, ctx: Context) -> list[str]:
    want = ctx.options.get("layout") or ctx.description.preferred_layout
    if want != "nhwc":
        return []
    producer = {s: n for n in graph.nodes for s in n.outputs}
    users = readers(graph)
    ok = {id(n): n for n in graph.nodes if capable(n, graph, ctx)}
    region: dict[int, Node] = {}
    todo = [n for n in ok.values() if n.op in CONVS]
    while todo:                       # grow each convolution's region through capable neighbours
        n = todo.pop()
        if id(n) in region:
            continue
        region[id(n)] = n
        for i in activation_args(n, graph):
            p = producer.get(n.args[i].slot)
            if p is not None and id(p) in ok:
                todo.append(p)
        for u in users.get(n.outputs[0], ()):
            if id(u) in ok and any(u.args[i] == Ref(n.outputs[0]) for i in activation_args(u, graph)):
                todo.append(u)
    if not region:
        return []
    keep = output_slots(graph) | ctx.protected
    renamed: dict[int, int] = {}          # NCHW slot -> its NHWC twin
    new_nodes, changes = [], []
    entered = exited = 0

    def new_slot(meta):
        s = graph.num_slots
        graph.num_slots += 1
        graph.slot_meta[s] = meta
        return s

    def transpose(name, src, dst, dims, what, like):
        return Node(index=-1, name=name, op="relayout", target=relayout_torch,
                    args=(Ref(src), list(dims)), kwargs={}, inputs=[src], outputs=[dst],
                    input_meta=[graph.slot_meta[src]], output_meta=[graph.slot_meta[dst]],
                    attrs={"dims": list(dims), "layout_change": what, **({"phase": like.attrs["phase"]}
                                                                         if "phase" in like.attrs else {})},
                    module_path=like.module_path, module_type=like.module_type, source=like.source,
                    source_line=like.source_line)

    for n in graph.nodes:
        if id(n) not in region:
            new_nodes.append(n)
            continue
        positions = activation_args(n, graph)
        args = list(n.args)
        moved = {args[i].slot for i in positions}
        for i in positions:
            s = args[i].slot
            if s not in renamed:          # a value from outside the region enters it once
                t = new_slot(nhwc(graph.slot_meta[s]))
                new_nodes.append(transpose(f"to_nhwc_{s}", s, t, TO_NHWC, "nchw->nhwc", n))
                renamed[s] = t
                entered += 1
            args[i] = Ref(renamed[s])
        out = n.outputs[0]
        twin = new_slot(nhwc(graph.slot_meta[out]))
        renamed[out] = twin
        n.args = tuple(args)
        n.inputs = [renamed[s] if s in moved else s for s in n.inputs]
        n.input_meta = [graph.slot_meta.get(s) or m for s, m in zip(n.inputs, n.input_meta)]
        n.outputs, n.output_meta = [twin], [graph.slot_meta[twin]]
        n.attrs["layout"] = "nhwc"
        n.attrs["nhwc_args"] = positions
        n.target = LayoutCall(n.target, positions)
        new_nodes.append(n)
        outside = [u for u in users.get(out, ()) if id(u) not in region]
        if outside or out in keep:        # the value leaves the region: back to NCHW under its own slot
            new_nodes.append(transpose(f"to_nchw_{out}", twin, out, TO_NCHW, "nhwc->nchw", n))
            exited += 1
    graph.nodes = new_nodes
    renumber(graph)
    convs = sum(1 for n in region.values() if n.op in CONVS)
    changes.append(f"{len(region)} op(s) around {convs} convolution(s) run in NHWC; {entered} transpose(s) in, "
                   f"{exited} out (a per-convolution layout change would take {2 * convs})")
    return changes


@define("relayout", "copy", doc="copy a value into another memory layout (inserted by the layout pass)")
def relayout(x, dims):
    import numpy as np
    return np.ascontiguousarray(np.transpose(x, dims))


def relayout_torch(x, dims):
    return x.permute(*dims).contiguous()


class LayoutCall:
    """A kernel that takes NHWC values at `positions` and returns NHWC: it hands the wrapped
    kernel NCHW views (torch: channels-last tensors) and views its result back."""

    def __init__(self, kernel, positions):
        self.kernel = kernel
        self.positions = list(positions)

    def __call__(self, *args, **kwargs):
        args = list(args)
        for i in self.positions:
            args[i] = _perm(args[i], TO_NCHW)
        return _perm(self.kernel(*args, **kwargs), TO_NHWC)

    def __repr__(self):
        return f"nhwc({self.kernel})"


def _perm(x, dims):
    if isinstance(x, torch.Tensor):
        return x.permute(*dims)
    import numpy as np
    return np.transpose(x, dims)


PASS = Pass("layout", ("hardware.preferred_layout",), run, __doc__.strip().splitlines()[0])
