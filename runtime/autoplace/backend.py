"""The auto backend: a Backend whose registry runs nothing itself -- its search (search.py) chose, per segment of
the graph, the stack that runs it, and placement asks it for each node's owner (runtime/placement.py).

    backend = create("auto:onnxruntime,torch:cpu", resolve)
    backend.ops.choice                       # None until placement sees a graph; then a Choice
    arm(backend, doc["auto"], where)         # a plan's choice: placement uses it, no search
"""
from __future__ import annotations

import hashlib
import json

from .. import registry
from ..description import Description
from ..errors import UsageError
from ..graph import Graph, Node
from ..hdi import Backend
from .spec import NAME, THREADS, budget, candidates, per_op_names
from .choice import Choice, Segment


PER_OP = "torch:cpu"           # what runs the nodes no chosen stack takes, unless auto:... names another


class AutoRegistry:
    """Placement's view of -b auto: `regions(graph)` gives the graph's nodes with each chosen stack's regions made,
    `owner(node)` the backend that runs a node. It claims no node for itself."""

    reference_kernels = False
    unsupported: set = set()
    supported = None
    dtypes = None

    def __init__(self, stacks: list[Backend], per_op: Backend, skipped: dict[str, str], spec: str):
        self.stacks = {b.name: b for b in stacks}
        self.per_op = per_op
        self.skipped = skipped                # stack -> why it is not a candidate here
        self.spec = spec
        self.choice: Choice | None = None     # a plan's (arm), the cache's, or the search's
        self._owner: dict[int, Backend] = {}
        # where the model's inputs are put: the backend of their first reader (a stack's numpy arrays, not a torch
        # copy and a transfer: on GPT-2 that round trip cost 0.3 ms of a 0.7 ms step)
        self.home: Backend = per_op

    @property
    def backends(self) -> dict[str, Backend]:
        return {**self.stacks, self.per_op.name: self.per_op}

    def with_choice(self, choice: Choice) -> Backend:
        """Another auto backend over the same candidates that places by `choice` (the search runs its finalists)."""
        backend = auto_backend(list(self.stacks.values()), self.per_op, dict(self.skipped), self.spec)
        backend.ops.choice = choice
        return backend

    def supports(self, node: Node) -> bool | str:
        return f"-b auto places {node.op} on the backend its search chose"

    def kernel_for(self, node: Node):
        raise UsageError(f"-b auto runs no kernel itself; node {node.name} has no chosen backend")

    def ops(self) -> list[str]:
        return []

    def owner(self, node: Node) -> Backend:
        return self._owner.get(id(node), self.per_op)

    def regions(self, graph: Graph, placement, volatile) -> list[Node]:
        """The nodes placement places: each chosen segment's regions (one node each), the rest per op."""
        from .search import search
        from .cache import load as cached, save as remember
        if self.choice is None and not self.stacks:      # nothing to choose: every op on the per-op backend
            self.choice = Choice([Segment(self.per_op.name, graph.nodes[0].name, graph.nodes[-1].name,
                                          len(graph.nodes))], source="no stack")
        if self.choice is None:
            key = cache_key(graph, self)
            self.choice = cached(key, self)
            if self.choice is None:
                self.choice = search(graph, self, volatile=volatile, budget=budget())
                remember(key, self.choice)
        nodes, self._owner = self.choice.build(graph, self, volatile)
        inputs = set(graph.input_slots)
        first = next((n for n in nodes if inputs.intersection(n.inputs)), None)
        self.home = self.owner(first) if first is not None else self.per_op
        placement.auto = self.choice.report(self)
        return nodes


def cache_key(graph: Graph, reg: AutoRegistry) -> str:
    """What makes two searches the same: the graph's ops, names and shapes, the candidates and their versions,
    and the threads they run on."""
    import torch
    nodes = [[n.name, n.op, [list(m.shape) if m else None for m in n.input_meta],
              [list(m.shape) if m else None for m in n.output_meta]] for n in graph.nodes]
    stacks = sorted((b.name, getattr(b.ops, "version", "")) for b in reg.backends.values())
    threads = [THREADS.get(), torch.get_num_threads()]
    body = json.dumps([nodes, stacks, threads, torch.__version__], default=str).encode()
    return hashlib.sha256(body).hexdigest()[:24]


def create(spec: str, resolve) -> Backend:
    named = candidates(spec)
    per_op_spec = next((s for s in named or () if s.partition(":")[0] in per_op_names()), PER_OP)
    per_op = resolve(per_op_spec)
    stacks, skipped = [], {}
    for name in (named if named is not None else registry.names(kind="regions")):
        entry = registry.get(name.partition(":")[0])
        if entry is None or entry.kind != "regions":
            continue
        try:
            b = resolve(name, with_fallback=False)
        except UsageError as e:                   # not installed, no such device: not a candidate here
            if named is not None:
                raise UsageError(f"backend {spec}: {e}") from None
            skipped[name] = str(e)
            continue
        _one_thread(b)
        stacks.append(b)
    backend = auto_backend(stacks, per_op, skipped, spec.strip())
    backend.resolve_spec = resolve
    return backend


def auto_backend(stacks: list[Backend], per_op: Backend, skipped: dict, spec: str) -> Backend:
    desc = Description(name=NAME, implementation=NAME, summary="each region on the stack that runs it fastest",
                       fallbacks=[], path="", passes={"fuse": False})
    reg = AutoRegistry(stacks, per_op, skipped, spec)
    backend = Backend(name=NAME, description=desc, ops=reg, memory=_HomeMemory(reg), device=per_op.device)
    backend.clock = per_op.clock
    backend.fallbacks = [per_op, *stacks]     # every backend it may place on (the executor flushes their clocks)
    return backend


class _HomeMemory:
    """The auto backend's memory is its home's (the backend the model's inputs go to): the executor puts the
    inputs there, and placement counts them there."""

    def __init__(self, reg: AutoRegistry):
        self._reg = reg

    def __getattr__(self, name):
        return getattr(self._reg.home.memory, name)


def _one_thread(b: Backend) -> None:
    """THREADS (the benchmark's one thread) into a stack's options, before its first compile."""
    t = THREADS.get()
    if t is not None and "threads" in (registry.get(b.description.implementation).options or {}):
        b.description.options = {**b.description.options, "threads": t}


def arm(backend: Backend, entry, where: str) -> None:
    """A plan's choice handed to the auto backend: placement builds it, nothing is measured."""
    if not isinstance(backend.ops, AutoRegistry):
        return
    if entry is None:
        raise UsageError(f"{where}: it holds no -b auto choice; compile it again with `opscope compile -b auto`")
    choice = Choice.from_doc(entry, where)
    missing = sorted({s.backend for s in choice.segments} - set(backend.ops.backends))
    if missing:
        raise UsageError(f"{where}: its -b auto choice runs regions on {', '.join(missing)}, which "
                         f"{'is' if len(missing) == 1 else 'are'} not a candidate here "
                         f"({'; '.join(backend.ops.skipped.get(m, 'not named') for m in missing)}): "
                         "recompile it (--recompile)")
    choice.source = "plan"
    backend.ops.choice = choice


def plan_entry(plan) -> dict | None:
    """What a plan file holds of an auto placement (None for any other backend)."""
    reg = plan.backend.ops
    return reg.choice.to_doc() if isinstance(reg, AutoRegistry) and reg.choice is not None else None
