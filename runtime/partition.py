"""Partitioning that never dies on a region: a stack's claimed regions, compiled, split where the stack fails.

    regions, splits = partition(graph, registry, claimed, volatile=...)   # every region compiled (region.program)
    splits[0].nodes, splits[0].reason       # members sent to the fallback, and the stack's own message

A stack's claim is a promise made per node (an op it has a rule for, in dtypes it computes); its compiler
then sees the whole region and may still refuse it -- OpenVINO's importer has no rule for aten::histc in
Mixtral's router, its CPU plugin fails an LSTM (`Check 'm_pMemDesc->isDefined()' failed`), the ONNX
exporter meets an `aten::full_like` it cannot spell in a training graph. Instead of ending the run, the
region is split: the member the stack's message names (its scope /n<i>/, or an `aten::op` it names) is
sent to the fallback, else the region's members are bisected (the shortest failing prefix ends with the
member that breaks it), and the rest is grouped and compiled again. Every stack shares this one loop;
a stack only raises StackFailed from its compile (region_check.py raises it for a compiled region whose values
are off ATen's, naming the member).

A refusal is kept by node name in the registry (`refused`) while placement asks it, so `supports()` gives
the stack's reason and the node runs on the fallback; a plan saves the splits and hands them back
(`remembered`, plan_regions.py) so loading it compiles only regions that work. A region that fails at run
time, on real data (an index out of bounds), still ends the run: compiling is what a split may retry.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from .errors import ModelError, first_line
from .graph import Graph, Node

_ATEN = re.compile(r"aten::(\w+)")


class StackFailed(ModelError):
    """A stack could not compile a region it claimed. `why`: the stack's own reason, one line (searched for
    the node or op it blames). `node`: the member it failed, where the caller found it (region_check.py)."""

    def __init__(self, stack: str, region, e: BaseException, why: str | None = None, *, node: Node | None = None):
        self.why = (why or f"{type(e).__name__}: {first_line(e)}")[:300]
        self.node = node
        ops = ", ".join(sorted({m.op for m in region.members}))
        super().__init__(f"{stack} could not compile {region.name} ({len(region.members)} nodes: {ops}): {self.why}")


@dataclass
class Split:
    """What one failure of the stack cost: the members sent to the fallback and why."""

    nodes: list[str]                  # the members the stack could not take
    ops: list[str]
    reason: str                       # the stack's own message
    found_by: str                     # "named by the stack" | "bisection"
    region_nodes: int                 # size of the region the stack failed
    compiles: int                     # compiles it took to find them (the failed one included)

    def row(self) -> dict:
        return asdict(self)


def partition(graph: Graph, registry, claimed: list[bool], *, volatile=frozenset()) -> tuple[list, list[Split]]:
    """The graph's regions for `registry` (a StackRegistry), each compiled (region.program set), with
    the members its stack failed refused in registry.refused and listed in the splits."""
    from .regions import group
    refused = registry.refused
    ready: dict[tuple, object] = {}               # member names -> program: a region met again is not recompiled
    splits: list[Split] = []

    def compile(region):
        key = tuple(m.name for m in region.members)
        if key not in ready:
            ready[key] = registry.program(region)
        return ready[key]

    while True:
        mask = [ok and n.name not in refused for n, ok in zip(graph.nodes, claimed)]
        regions = group(graph, mask, volatile=volatile)
        for region in regions:
            try:
                region.program = compile(region)
            except StackFailed as e:
                culprits, how, reason, tries = _culprits(graph, region, e, mask, compile, volatile)
                for m in culprits:
                    refused[m.name] = f"{registry.stack} failed it inside a region: {reason}"
                splits.append(Split([m.name for m in culprits], sorted({m.op for m in culprits}), reason, how,
                                    len(region.members), tries))
                break
        else:
            return regions, splits


def _culprits(graph: Graph, region, e: StackFailed, mask: list[bool], compile, volatile):
    """(members to refuse, how they were found, the stack's reason, compiles spent)."""
    # NOTE: the stack's reason line only: an exporter's full message may print the whole graph, every op in it
    named = e.node or region.member_of_scope(e.why)
    if named is not None:
        return [named], "named by the stack", e.why, 1
    ops = {o.rstrip("_") for o in _ATEN.findall(e.why)}
    hit = [m for m in region.members if aten_name(m) in ops]
    if hit:
        return hit, "named by the stack", e.why, 1
    # bisection: the shortest failing prefix; its last member is the one that breaks it
    from .regions import group
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    first = index[id(region.members[0])]
    lo, hi, why, tries = 0, len(region.members), e.why, 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        prefix = [False] * len(mask)
        for i in range(first, first + mid):
            prefix[i] = mask[i]
        (sub,) = group(graph, prefix, volatile=volatile)
        tries += 1
        try:
            compile(sub)
            lo = mid
        except StackFailed as f:
            hi, why = mid, f.why
    return [region.members[hi - 1]], "bisection", why, tries


def aten_name(node: Node) -> str:
    schema = getattr(node.target, "_schema", None)
    name = schema.name if schema is not None else ""
    return name.removeprefix("aten::").rstrip("_")
