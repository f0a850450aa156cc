"""Regions: a compiler stack claims runs of nodes and compiles each as one program.

    claimed = [backend.ops.supports(n) is True for n in graph.nodes]    # the stack's claim, per node
    regions = group(graph, claimed)           # runs of claimed nodes, in execution order
    node = region_node(region)                # what placement and the executor see: one node

A stack backend (onnxruntime, openvino, xla) implements two things next to the HDI's three modules,
the way ONNX Runtime's execution providers implement GetCapability and Compile:

    claim(node) -> True | reason              which nodes it takes (an op it has no lowering for: a reason)
    compile(region) -> RegionProgram          one program for the region: program(*inputs) -> [outputs]

`StackRegistry` (stack_registry.py) turns those two into an OperatorRegistry, so placement asks it as it asks any backend;
partitioning is opscope's, not the vendor's. A stack whose conversions can run and return wrong values gives it
a `tolerance`: each region it compiles is then checked against ATen once, at compile (region_check.py), and a
member it gets wrong fails the compile, so partitioning sends it to the fallback like one the stack refuses. A region's members stay on its node (attrs["members"]),
so tools name and step into them, and its FLOPs are its members'. Its inputs and outputs are its only
transfers: parameters are compiled into the program (folded, pre-packed by the stack), except those a
training step replaces between runs (`volatile`), which stay inputs.

A region is a run of consecutive claimed nodes in the graph's order (a topological order), so it never
needs a value computed after it: no cycle between a region and the nodes around it. `to_torch` gives a
region as a torch module whose every member runs in its own submodule `n<i>`: exporters (ONNX,
OpenVINO) carry that scope into their node names, and a stack's profile maps back to members by it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from .graph import Graph, Node, Ref, TensorMeta, materialize
from .ops.registry import define, flops_of, members_flops


@define("region", "region", flops=members_flops, doc="a run of nodes a compiler stack compiled as one program "
        "(made by placement; its members are in attrs['members'])")
def _region_reference(*args):
    raise RuntimeError("a region runs through its stack's compiled program, not a reference kernel")


@dataclass
class Region:
    name: str
    members: list[Node]
    inputs: list[int]                 # slots read from outside: user inputs, other backends' values, volatile constants
    outputs: list[int]                # slots read after the region, returned by the graph, or carried
    constants: dict[int, Any]         # slot -> host value compiled into the program
    slot_meta: dict[int, TensorMeta]
    # its RegionProgram once placement compiled it (partition.py); not copied by dataclasses.replace (a region
    # with other outputs is another program)
    program: Any = field(default=None, init=False, repr=False, compare=False)

    def member_of_scope(self, name: str) -> Node | None:
        """The member a stack's node name comes from (`/n12/MatMul`, `__module.n12/...` -> members[12])."""
        m = _SCOPE.search(name)
        return self.members[int(m.group(1))] if m and int(m.group(1)) < len(self.members) else None


_SCOPE = re.compile(r"(?:^|[/.])n(\d+)(?:/|$)")    # ONNX: /n12/MatMul; OpenVINO: __module.n12/aten::linear/Add


@dataclass
class ChildEvent:
    """One span from inside a region, out of the stack's own profiler: the ops it covers (more than one
    when the stack fused them), their names, and times on the host clock of the region's run."""

    region: str                       # the parent: the region node's name
    name: str                         # the stack's own node name
    kernel: str                       # the stack's op type (MatMul, Gelu, ...)
    nodes: list[str]                  # opscope node names covered
    ops: list[str]
    module_path: str
    start_ns: int
    end_ns: int
    flops: int
    clock: str                        # where the times came from, e.g. "onnxruntime profiler"


class RegionProgram:
    """A compiled region: call it with the region's inputs, get its outputs. Between start_profile() and
    stop_profile() the calls run under the stack's own profiler; stop_profile() returns their per-op
    spans (ChildEvents). Both are called outside the region's timed call (RegionProfile does)."""

    def __init__(self, region: Region, run: Callable):
        self.region = region
        self.run = run

    def __call__(self, *inputs):
        return self.run(*inputs)

    from_plan = False                 # loaded from a plan's saved program, not compiled in this process

    def artifact(self) -> bytes | None:
        """The compiled program as bytes a plan can hold (ONNX model, OpenVINO IR, serialized StableHLO), or
        None when the stack has no such form: `opscope compile` saves it, `run --plan` loads it back."""
        return None

    def start_profile(self) -> None:
        """Get the stack's profiler ready (a stack without one records nothing)."""

    def stop_profile(self) -> list[ChildEvent]:
        return []

    @staticmethod
    def fitted(durations: list[int], t0: int, t1: int) -> list[tuple[int, int]]:
        """Spans for per-op durations that do not add up to the call's own time [t0, t1] (OpenVINO's per-layer
        times sum to 1.05-1.6x it; XLA's thunks leave dispatch gaps between them): laid end to end in order,
        scaled so they cover the call exactly, none shorter than 1 ns (an op that ran took time). Events built
        from these say so in their clock."""
        total, n = sum(max(d, 0) for d in durations), len(durations)
        if not n:
            return []
        span = max(t1 - t0, n)
        # NOTE: each op keeps 1 ns of its own; the rest of the call is shared by the durations
        weights = [max(d, 0) / total if total else 1 / n for d in durations]
        out, at, acc = [], t0, 0.0
        for i, w in enumerate(weights):
            acc += w
            end = t0 + (i + 1) + int(round(acc * (span - n)))
            out.append((at, max(end, at + 1)))
            at = out[-1][1]
        return out

    def child(self, stack_name: str, kernel: str, start_ns: int, end_ns: int, clock: str,
              covered: list[Node] | None = None) -> ChildEvent:
        """A span named by the stack; `covered`: the members it ran, when the stack says (else its scope)."""
        m = self.region.member_of_scope(stack_name)
        covered = list({id(n): n for n in ([m] if m is not None else []) + list(covered or [])}.values())
        return ChildEvent(self.region.name, stack_name, kernel, [n.name for n in covered], [n.op for n in covered],
                          covered[0].module_path if covered else "", start_ns, end_ns,
                          sum(flops_of(n) for n in covered), clock)


    def absorb(self, children: list[ChildEvent]) -> list[ChildEvent]:
        """Members no span names go to the span that ran them: a view the stack made a bitcast, a constant it
        folded, a transpose it merged into a matmul leave no kernel of their own and no name in the profile;
        their work (if any) is inside the span of the member that reads their output (or, for a region output
        nothing reads, of the member that made their input). Spans are matched by the stack's node name, so
        every call of a step gets the same ops."""
        members = {m.name: m for m in self.region.members}
        home: dict[str, str] = {}                 # member -> the stack node that covers it
        for c in children:
            for n in c.nodes:
                home.setdefault(n, c.name)
        readers: dict[int, list[Node]] = {}
        for m in self.region.members:
            for s in m.inputs:
                readers.setdefault(s, []).append(m)
        maker = {s: m for m in self.region.members for s in m.outputs}

        def find(m: Node, seen: set) -> str | None:
            if m.name in home:
                return home[m.name]
            seen.add(m.name)
            around = [r for s in m.outputs for r in readers.get(s, [])] + [maker[s] for s in m.inputs if s in maker]
            for n in around:
                if n.name not in seen and (h := find(n, seen)) is not None:
                    return h
            return None
        extra: dict[str, list[Node]] = {}
        for m in self.region.members:
            if m.name not in home and (h := find(m, set())) is not None:
                extra.setdefault(h, []).append(m)
        for c in children:
            for m in extra.get(c.name, ()):
                c.nodes.append(m.name)
                c.ops.append(m.op)
                c.flops += flops_of(m)
        assert all(n in members for c in children for n in c.nodes)
        return children


class RegionProfile:
    """An executor hook: each region's per-op spans from its stack's profiler, per step.

        prof = RegionProfile()
        with executor.hooked(prof, recorder):
            executor.run(*inputs)
        prof.children[(0, "region0")]          # [ChildEvent], parent region0, step 0
    """

    def __init__(self):
        self.children: dict[tuple[int, str], list[ChildEvent]] = {}

    def _programs(self, plan):
        return [st.kernel for st in plan.steps if isinstance(st.kernel, RegionProgram)]

    def on_run_start(self, info) -> None:
        for p in self._programs(info.plan):
            p.start_profile()

    def on_run_end(self, info, error) -> None:
        for p in self._programs(info.plan):
            self.children[(info.step, p.region.name)] = p.absorb(p.stop_profile())


def single(node: Node) -> Region:
    """One node as a region (for per-op checks): its tensor inputs, in order, are the region's inputs."""
    meta = {s: m for s, m in zip(node.inputs, node.input_meta)} | \
           {s: m for s, m in zip(node.outputs, node.output_meta) if m is not None}
    return Region(f"region_{node.name}", [node], list(dict.fromkeys(node.inputs)), list(node.outputs), {}, meta)


def group(graph: Graph, claimed: list[bool], *, volatile=frozenset(), extra_readers=frozenset()) -> list[Region]:
    """Runs of consecutive claimed nodes as Regions (no region of a lone view: nothing to compile)."""
    keep = {r.slot for r in _refs(graph.output_refs)} | set(extra_readers)
    last_reader: dict[int, int] = {}
    for i, n in enumerate(graph.nodes):
        for s in n.inputs:
            last_reader[s] = i
    runs, cur = [], []
    for i, ok in enumerate(claimed):
        if ok:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    regions = []
    for idx in runs:
        members = [graph.nodes[i] for i in idx]
        made = {s for m in members for s in m.outputs}
        inputs, constants = [], {}
        for m in members:
            for s in m.inputs:
                if s in made or s in inputs or s in constants:
                    continue
                if s in graph.constant_slots and s not in volatile and graph.constant_slots[s] is not None:
                    constants[s] = graph.constant_slots[s]
                else:
                    inputs.append(s)
        outputs = [s for m in members for s in m.outputs if s in keep or last_reader.get(s, -1) > idx[-1]]
        regions.append(Region(f"region{len(regions)}", members, inputs, outputs, constants, graph.slot_meta))
    return regions


def _refs(tree):
    if isinstance(tree, Ref):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for t in tree:
            yield from _refs(t)
    elif isinstance(tree, dict):
        for t in tree.values():
            yield from _refs(t)


def region_node(region: Region, backend_name: str) -> Node:
    """The one node placement and the executor see for a region."""
    first = region.members[0]
    meta = region.slot_meta
    return Node(index=first.index, name=region.name, op="region", target=None,
                args=tuple(Ref(s) for s in region.inputs), kwargs={}, inputs=list(region.inputs),
                outputs=list(region.outputs), input_meta=[meta.get(s) or TensorMeta((), "float32") for s in region.inputs],
                output_meta=[meta.get(s) for s in region.outputs],
                attrs={"members": list(region.members), "region": region, "backend": backend_name},
                module_path=_common_path([m.module_path for m in region.members]), module_type="region",
                source=first.source, source_line=first.source_line, multi_output=True)


def failure(node: Node, backend_name: str, e: BaseException) -> str:
    """One line for a region whose stack raised while running it: the region, its first ops, the member the
    stack's message names (ONNX Runtime and OpenVINO name their nodes by the member's scope, /n<i>/), the
    backend and the stack's own reason."""
    from .errors import first_line
    members, why = node.attrs["members"], first_line(e)
    ops = list(dict.fromkeys(m.op for m in members))
    listed = ", ".join(ops[:5]) + (f" and {len(ops) - 5} more ops" if len(ops) > 5 else "")
    blamed = node.attrs["region"].member_of_scope(why) if "region" in node.attrs else None
    at = f" at node {blamed.name} ({blamed.op}{' in ' + blamed.module_path if blamed.module_path else ''})" \
        if blamed is not None else ""
    return (f"region {node.name} ({len(members)} nodes: {listed}) failed inside {backend_name}{at}: "
            f"{type(e).__name__}: {why}")


def _common_path(paths: list[str]) -> str:
    parts = [p.split(".") for p in paths if p]
    if not parts:
        return ""
    common = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)


def report(regions_placed: list[tuple[Node, str]], left_out: list[dict]) -> dict:
    """The placement report's `regions` entry: nodes per region, edge bytes, and why nodes stayed out."""
    rows = []
    for node, backend in regions_placed:
        ops: dict[str, int] = {}
        for m in node.attrs["members"]:
            ops[m.op] = ops.get(m.op, 0) + 1
        rows.append({"name": node.name, "backend": backend, "nodes": len(node.attrs["members"]), "ops": ops,
                     "inputs": len(node.inputs), "outputs": len(node.outputs),
                     "input_bytes": sum(m.nbytes for m in node.input_meta if m is not None),
                     "output_bytes": sum(m.nbytes for m in node.output_meta if m is not None)})
    return {"regions": rows, "left_out": left_out}


# --- a region as a torch module (what the ONNX and OpenVINO exporters take) --------------------
def to_torch(region: Region, *, target: Callable[[Node], Callable] | None = None):
    """A torch.nn.Module computing the region: forward(*inputs) -> tuple of outputs, with every member in its
    own submodule `n<i>` (exporters name the stack's nodes by that scope) and the constants as buffers.
    target(node): what a member runs (default: the torch form exporters trace where it has one, else its ATen
    op; region_check.py runs the ATen ops themselves)."""
    import torch

    from .export_forms import form

    class Member(torch.nn.Module):
        def __init__(self, node):
            super().__init__()
            self.node = node
            # an op the exporters have no rule for runs as its torch form (export_forms.py), traced into ops they have
            self.target = target(node) if target is not None else form(node.target) or node.target

        def forward(self, *args, **kwargs):
            return self.target(*args, **kwargs)

    class RegionModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.consts = {}
            for s, v in region.constants.items():
                if isinstance(v, torch.Tensor):
                    self.register_buffer(f"c{s}", v.detach().clone())
                else:
                    self.consts[s] = v
            for i, m in enumerate(region.members):
                self.add_module(f"n{i}", Member(m))

        def forward(self, *inputs):
            env = dict(zip(region.inputs, inputs))
            env.update(self.consts)
            for s in region.constants:
                if s not in env:
                    env[s] = getattr(self, f"c{s}")
            for i, m in enumerate(region.members):
                out = getattr(self, f"n{i}")(*materialize(m.args, env), **{k: materialize(v, env) for k, v in m.kwargs.items()})
                if m.multi_output:
                    for s, v in zip(m.outputs, out):
                        env[s] = v
                elif m.outputs:
                    env[m.outputs[0]] = out
            return tuple(env[s] for s in region.outputs)

    return RegionModule().eval()


def example_inputs(region: Region):
    """Tensors of the region's input shapes and dtypes (exporters trace with them)."""
    import torch

    from .dtypes import to_torch as torch_dtype
    out = []
    for s in region.inputs:
        m = region.slot_meta[s]
        dt = torch_dtype(m.dtype)
        out.append(torch.zeros(m.shape, dtype=dt) if not dt.is_floating_point else torch.randn(m.shape, dtype=dt))
    return tuple(out)


# ops whose meaning depends on the storage under a view, not its values: inside a stack's region every value is a
# fresh contiguous array, so eager's as_strided over a partial view (storage_offset, a slice) cannot be reproduced
READS_STORAGE = frozenset({"as_strided", "as_strided_scatter"})


@dataclass
class Claim:
    """What a stack can take, by op name and dtype: the common shape of a stack's claim()."""

    ops: frozenset = field(default_factory=frozenset)    # empty: any op with an ATen target
    refused: frozenset = field(default_factory=frozenset)
    dtypes: frozenset = frozenset({"float32", "float16", "bfloat16", "int64", "int32", "bool"})
    # the torch.library namespaces the stack's importer lowers; None: any (XLA lowers opscope's own sgd/adamw)
    namespaces: frozenset | None = None

    def __call__(self, node: Node) -> bool | str:
        import torch
        if not isinstance(node.target, torch._ops.OpOverload):
            return f"{node.op} has no ATen target to lower"
        if self.namespaces is not None and node.target.namespace not in self.namespaces:
            return (f"{node.op} is not an op of {'/'.join(sorted(self.namespaces))} ({node.target.namespace}::"
                    f"{node.op}): the stack's importer lowers those only")
        if node.op in self.refused or (self.ops and node.op not in self.ops):
            return f"{node.op} has no lowering on this stack"
        if node.op in READS_STORAGE:
            return (f"{node.op} reads its input's storage (offset and strides), which a region's values do not "
                    "carry: a partial view would read the wrong elements")
        for m in list(node.input_meta) + list(node.output_meta):
            if m is not None and m.dtype not in self.dtypes:
                return f"{node.op} on {m.dtype}: the stack does not compute in {m.dtype}"
        return True
