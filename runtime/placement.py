"""Placement: which backend runs each node, and the transfers between them.

Like ONNX Runtime's partitioning: the chosen backend claims every node its registry supports;
the rest go to its fallback, with explicit `transfer` nodes where a value crosses backends.
The result is a report a user can read.

A compiler stack (runtime/regions.py) claims runs of nodes instead: each run becomes one region node,
placed like any node, whose inputs and outputs are its only transfers; the nodes it left out are placed
op by op as above, and the report lists the regions and why each left-out node stayed out.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import UnsupportedOpError
from .fallback import fallback_chain, suggestion
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
    backend: Backend | None = None                                   # the backend asked to run the graph
    passed_over: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    # (op, fallback that took it) -> {earlier fallback: why it refused}
    left_out: list[dict] = field(default_factory=list)    # a stack's refusals: {node, op, reason}
    splits: list = field(default_factory=list)            # regions the stack failed, split (partition.Split)
    auto: dict | None = None                              # -b auto: what its search chose and measured

    def report(self) -> dict:
        per_backend: dict[str, int] = {}
        fell_back: dict[tuple[str, str], dict] = {}
        for node, b in self.assignments:
            if node.op == "transfer":
                continue
            # a region counts the nodes it runs, so the table reads the same whether or not a stack grouped them
            per_backend[b.name] = per_backend.get(b.name, 0) + (len(node.attrs["members"]) if node.op == "region" else 1)
            if getattr(node, "fallback", False):
                f = fell_back.setdefault((node.op, b.name), {
                    "op": node.op, "nodes": 0, "backend": b.name, "reason": self.reasons.get(node.op, ""),
                    "refused_by": [{"backend": n, "reason": r}
                                   for n, r in self.passed_over.get((node.op, b.name), {}).items()]})
                f["nodes"] += 1
        out = {"nodes_per_backend": per_backend,
               "fallback_ops": sorted(fell_back.values(), key=lambda r: (r["op"], r["backend"])),
               "transfers": self.transfers, "transfer_bytes": self.transfer_bytes}
        placed = [(n, b.name) for n, b in self.assignments if n.op == "region"]
        if placed or self.left_out:
            from .regions import report
            out.update(report(placed, self.left_out))
            out["splits"] = [sp.row() for sp in self.splits]
        if self.auto is not None:
            out["auto"] = self.auto
        return out


def choose(node: Node, backend: Backend, chain: list[Backend]) -> tuple[Backend | None, dict[str, str]]:
    """The backend that runs `node`: `backend` if it can, else the first of `chain` that can
    (None: nobody). Also why each backend asked before it refused, by name."""
    refused: dict[str, str] = {}
    for b in (backend, *chain):
        ok = b.ops.supports(node)
        if ok is True:
            return b, refused
        refused[b.name] = str(ok)
    return None, refused


def place(graph: Graph, backend: Backend, *, allow_fallback: bool = True, volatile=frozenset()) -> Placement:
    """`volatile`: constant slots a run replaces (training's carry): a region reads them as inputs."""
    where: dict[int, Backend] = {}     # slot -> backend holding it (None: a constant, anywhere)
    moved: dict[tuple[int, str], int] = {}
    out: list[tuple[Node, Backend]] = []
    unsupported: dict[str, list[str]] = {}
    reasons: dict[str, str] = {}
    refusals: dict[str, dict[str, str]] = {}          # unsupported op -> {backend: why}
    next_slot = [graph.num_slots]
    placement = Placement(out, backend=backend)
    chain = fallback_chain(backend, allow_fallback)     # allow_fallback may add backends: runtime/fallback.py
    # -b auto (runtime/autoplace): its search chose every node's backend; none of them is a fallback
    owner = getattr(backend.ops, "owner", None)
    nodes = _claimed_regions(graph, backend, placement, volatile)
    # NOTE: after _claimed_regions: -b auto learns its home (its inputs' first reader) only once it has chosen;
    # read before, the inputs sat on the per-op backend and every step paid a transfer to the chosen stack
    for s in graph.input_slots:
        where[s] = backend if owner is None else backend.ops.home

    for node in nodes:
        target, refused = choose(node, backend, chain) if owner is None else (owner(node), {})
        node.fallback = target is not None and target is not backend and owner is None
        if refused:
            reasons.setdefault(node.op, refused[backend.name])
        if target is None:
            unsupported.setdefault(node.op, []).append(node.name)
            refusals.setdefault(node.op, refused)
            continue
        if node.fallback:
            skipped = {n: r for n, r in refused.items() if n != backend.name}
            placement.passed_over.setdefault((node.op, target.name), skipped)
        # Values produced on another backend travel through an explicit transfer node.
        remap = {}
        for s in node.inputs:
            src = where.get(s)
            if src is None and s in graph.constant_slots:
                # a constant lives on the backend of its first reader (compile_plan puts it there); a reader
                # on another backend -- a parameter a region reads and the fallback's optimizer updates --
                # gets it through a transfer like any value
                where[s] = target
                continue
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
                tr.fallback = target is not backend and owner is None
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
        raise UnsupportedOpError(_refusal(backend, unsupported, refusals, chain, allow_fallback), sorted(unsupported))
    return placement


def _claimed_regions(graph: Graph, backend: Backend, placement: Placement, volatile) -> list[Node]:
    """The graph's nodes, each run of nodes a compiler stack claims replaced by one region node, compiled; a
    region the stack fails is split and the members it cannot take are left out (partition.py)."""
    from .partition import partition
    from .regions import region_node
    from .stack_registry import StackRegistry
    if hasattr(backend.ops, "regions"):                      # -b auto: regions on the stacks its search chose
        return backend.ops.regions(graph, placement, volatile)
    if not isinstance(backend.ops, StackRegistry):
        return graph.nodes                                   # a per-op backend: nothing changes
    registry = backend.ops
    registry.refused, registry.remembered = dict(registry.remembered), {}     # a plan's splits, else none yet
    answers = [registry.supports(n) for n in graph.nodes]
    regions, placement.splits = partition(graph, registry, [a is True for a in answers], volatile=volatile)
    placement.left_out = [{"node": n.name, "op": n.op, "reason": str(a)}
                          for n in graph.nodes if (a := registry.supports(n)) is not True]
    first = {id(r.members[0]): r for r in regions}
    inside = {id(m) for r in regions for m in r.members}
    nodes = []
    for n in graph.nodes:
        if id(n) in first:
            nodes.append(region_node(first[id(n)], backend.name))
        elif id(n) not in inside:
            nodes.append(n)
    return nodes


def _refusal(backend: Backend, unsupported: dict, refusals: dict, chain: list, allow_fallback: bool) -> str:
    """One line: every op nobody runs, its first node, and what the user can do about it."""
    def nodes(names):
        return f"node {names[0]}" + (f" and {len(names) - 1} more" if len(names) > 1 else "")

    if chain:           # the fallbacks were asked and refused too: say which and why
        listing = "; ".join(f"{op} ({nodes(n)}): " + ", ".join(f"{b} says {why}" for b, why in refusals[op].items())
                            for op, n in sorted(unsupported.items()))
        how = suggestion(backend, chain, "add a fallback that runs them to backend.fallback in its description")
        return (f"backend {backend.name} and its fallbacks ({', '.join(b.name for b in chain)}) cannot run "
                f"{listing}; {how}")
    listing = ", ".join(f"{op} ({nodes(n)})" for op, n in sorted(unsupported.items()))
    if backend.fallbacks and not allow_fallback:
        how = "run without --no-fallback"
    else:
        how = suggestion(backend, chain, "give the backend a fallback in its description (backend.fallback)")
    return f"backend {backend.name} cannot run {listing}; {how}"


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
