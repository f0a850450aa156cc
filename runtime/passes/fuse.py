"""fuse: a chain of pointwise ops (and the reduction that follows it) becomes one `fused` node.

The fused node reads only the chain's external inputs and writes only the values read outside it,
so a backend runs it as one kernel: numpy through one generated function with preallocated
buffers (codegen.py), torch through a sequential call of the members' ATen kernels (FusedCall),
sim with one launch and only the external bytes on its roofline (the node's bytes_moved).
The members stay on the node (`attrs["members"]`: Nodes with their op, module path and source
line), so tools can name and step into them.
"""
from __future__ import annotations

from ..graph import Node, Ref
from ..ops.registry import define, members_flops
from .base import Context, Pass, output_slots, pointwise, readers, renumber  # noqa: F401  (pointwise: re-exported)

# reductions that may close a chain (over the chain's last value)
REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "prod", "softmax", "log_softmax", "layer_norm", "rms_norm"})
MIN_MEMBERS = 2


@define("fused", "fused", flops=members_flops, doc="a chain of pointwise ops and a reduction run as one kernel "
        "(made by the fuse pass; its members are in attrs['members'])")
def _fused_reference(*args):
    raise RuntimeError("a fused node runs through its backend's fused kernel, not a reference kernel")


def members(node: Node) -> list[Node]:
    """The ops a fused node runs, in order (empty for any other node)."""
    return list(node.attrs.get("members", ())) if node.op == "fused" else []


def member_records(node: Node) -> list[dict]:
    """A fused node's members as plain data (op, node name, module path, source line): what a run
    records so that its op table, timeline and exports name them (empty for any other node)."""
    return [{"op": m.op, "node": m.name, "module": m.module_path or "", "source": m.source or ""}
            for m in members(node)]


def fused_members(nodes) -> dict[str, list[dict]]:
    """{fused node name: member_records(...)} for every fused node among `nodes` (a graph's or a plan's)."""
    return {n.name: member_records(n) for n in nodes if n.op == "fused"}


def reduction(node: Node) -> bool:
    return node.op in REDUCTIONS and not node.multi_output and len(node.outputs) == 1 and \
        node.output_meta[0] is not None


def run(graph, ctx: Context) -> list[str]:
    import torch
    changes = []
    keep = output_slots(graph) | ctx.protected
    users = readers(graph)
    groups, cur = [], []

    def flush():
        if len(cur) >= MIN_MEMBERS:
            groups.append(list(cur))
        cur.clear()

    from .layout import LayoutCall
    for n in graph.nodes:
        ok = isinstance(n.target, (torch._ops.OpOverload, LayoutCall)) and ctx.supports(n)
        point, red = ok and pointwise(n), ok and reduction(n)
        joins = cur and (point or red) and n.attrs.get("phase") == cur[0].attrs.get("phase") and \
            any(s in cur[-1].outputs or any(s in m.outputs for m in cur) for s in n.inputs)
        if joins:
            cur.append(n)
            if red:
                flush()
            continue
        flush()
        if point:
            cur.append(n)
    flush()
    if not groups:
        return changes
    replace = {}
    for g in groups:
        fused = build(g, graph, users, keep)
        replace[id(g[-1])] = fused
        for m in g[:-1]:
            replace[id(m)] = None
        changes.append(f"fused {' -> '.join(m.op for m in g)} ({', '.join(m.name for m in g)}) into {fused.name}: "
                       f"{len(fused.inputs)} input(s), {len(fused.outputs)} output(s) leave the kernel")
    graph.nodes = [replace.get(id(n), n) for n in graph.nodes if replace.get(id(n), n) is not None]
    renumber(graph)
    return changes


def build(group: list[Node], graph, users, keep) -> Node:
    """One fused node for `group` (consecutive in the graph, so it may sit where the last one was)."""
    inside = {s for m in group for s in m.outputs}
    ext = list(dict.fromkeys(s for m in group for s in m.inputs if s not in inside))
    names = {id(m) for m in group}
    outs = [s for m in group for s in m.outputs
            if s in keep or any(id(u) not in names for u in users.get(s, ()))]
    if not outs:
        outs = list(group[-1].outputs)
    meta = graph.slot_meta
    paths = [m.module_path.split(".") for m in group if m.module_path]
    common = []
    for parts in zip(*paths) if paths else ():
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    node = Node(index=-1, name="fused[" + "+".join(m.name for m in group) + "]", op="fused", target=None,
                args=tuple(Ref(s) for s in ext), kwargs={}, inputs=ext, outputs=outs,
                input_meta=[meta[s] for s in ext], output_meta=[meta[s] for s in outs],
                attrs={"members": list(group), "member_ops": [m.op for m in group]},
                module_path=".".join(common), module_type=group[-1].module_type, source=group[0].source,
                source_line=group[0].source_line, multi_output=len(outs) > 1)
    for key in ("phase", "fwd_node"):
        if key in group[0].attrs:
            node.attrs[key] = group[0].attrs[key]
    node.target = FusedCall(node)
    return node


class FusedCall:
    """Runs a fused node's members one after another with their own kernels (torch: the ATen
    overloads; `kernels` overrides them, e.g. with numpy reference kernels for stepping)."""

    def __init__(self, node: Node, kernels: list | None = None):
        self.members = members(node)
        self.inputs = list(node.inputs)
        self.outputs = list(node.outputs)
        self.multi = node.multi_output
        self.kernels = kernels or [m.target for m in self.members]

    def __call__(self, *args):
        env = dict(zip(self.inputs, args))
        for m, k in zip(self.members, self.kernels):
            env[m.outputs[0]] = k(*resolve(m.args, env), **resolve(m.kwargs, env))
        return [env[s] for s in self.outputs] if self.multi else env[self.outputs[0]]

    def __repr__(self):
        return "fused(" + ", ".join(m.op for m in self.members) + ")"


def resolve(v, env):
    if isinstance(v, Ref):
        return env[v.slot]
    if isinstance(v, list):
        return [resolve(x, env) for x in v]
    if isinstance(v, tuple):
        return tuple(resolve(x, env) for x in v)
    if isinstance(v, dict):
        return {k: resolve(x, env) for k, x in v.items()}
    return v


def fusion_gain(graph, desc) -> float:
    """Seconds the cost model says fusion saves on `desc`: each fused node's members' roofline
    times, minus the fused node's own (one launch, external bytes only)."""
    from ..roofline import node_seconds
    return sum(sum(node_seconds(m, desc) for m in members(n)) - node_seconds(n, desc)
               for n in graph.nodes if n.op == "fused")


PASS = Pass("fuse", ("operators.supported", "operators.unsupported"), run, __doc__.strip().splitlines()[0])
