"""What -b auto chose: segments of the graph's order, each on one backend, with what the search measured.

    choice.build(graph, registry, volatile)   # (nodes for placement, node id -> owner backend)
    choice.report(registry)                   # the placement report's "auto" entry
    choice.to_doc() / Choice.from_doc(doc)    # in a plan file and the cache: JSON, checked when read
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import UsageError
from ..graph import Graph, Node

MAX_SEGMENTS = 100_000


def program_key(stack: str, region) -> tuple:
    """A compiled region is reused for a region with the same members reading the same inputs."""
    return stack, tuple(m.name for m in region.members), tuple(region.inputs), tuple(region.outputs)


@dataclass
class Segment:
    backend: str                      # the backend that runs it (a stack's regions, or per op)
    first: str                        # node names, inclusive, in the graph's order
    last: str
    nodes: int
    seconds: float | None = None      # measured (or the per-op sum) at search time
    runners_up: list = field(default_factory=list)    # [{backend, seconds | None, how, reason}]
    module: str = ""


@dataclass
class Choice:
    segments: list[Segment]
    step_seconds: float | None = None             # the chosen placement's predicted step (sum of the segments)
    single: dict = field(default_factory=dict)    # backend -> the step if it ran everything it claims alone
    search: dict = field(default_factory=dict)    # seconds, candidates measured, budget, failures, granularity
    source: str = "search"                        # search | cache | plan
    programs: dict = field(default_factory=dict, repr=False)   # (stack, member names) -> compiled program

    # --- placement -----------------------------------------------------------------------
    def build(self, graph: Graph, reg, volatile) -> tuple[list[Node], dict[int, object]]:
        from ..regions import group, region_node
        index = {n.name: i for i, n in enumerate(graph.nodes)}
        backends = reg.backends
        nodes, owner, k, at = [], {}, 0, 0
        for seg in self.segments:
            i, j = index.get(seg.first), index.get(seg.last)
            if i != at or j is None or j < i or j - i + 1 != seg.nodes or seg.backend not in backends:
                raise UsageError(f"the -b auto choice does not fit this graph (segment {seg.first}..{seg.last} on "
                                 f"{seg.backend}): recompile it (--recompile), or run -b auto again")
            at = j + 1
            b = backends[seg.backend]
            if b is reg.per_op:
                nodes += graph.nodes[i:j + 1]
                continue
            mask = [False] * len(graph.nodes)
            for x in range(i, j + 1):
                mask[x] = b.ops.supports(graph.nodes[x]) is True
            grouped = group(graph, mask, volatile=volatile)
            made = {id(m) for r in grouped for m in r.members}
            regions = {id(r.members[0]): r for r in grouped}
            for x in range(i, j + 1):
                n = graph.nodes[x]
                if id(n) in regions:
                    r = regions[id(n)]
                    r.name = f"region{k}"
                    k += 1
                    program = self.programs.get(program_key(b.name, r))
                    if program is not None:
                        program.region.name = r.name
                        r.program = program
                    node = region_node(r, b.name)
                    owner[id(node)] = b
                    nodes.append(node)
                elif id(n) not in made:
                    nodes.append(n)           # a node the stack refuses inside its segment: per op
        if at != len(graph.nodes):
            raise UsageError("the -b auto choice does not cover this graph: recompile it (--recompile), or run "
                             "-b auto again")
        return nodes, owner

    # --- the report ----------------------------------------------------------------------
    def report(self, reg) -> dict:
        step = self.step_seconds
        out = {"spec": reg.spec, "source": self.source, "searched": self.source == "search",
               "clock": "CPU time",           # every time here: the process's CPU time, all threads (search.py)
               "candidates": sorted(reg.backends), "not_candidates": dict(reg.skipped),
               "segments": [vars(s) | {} for s in self.segments], "step_seconds": step,
               "single": dict(self.single),
               "gain": {b: t / step for b, t in self.single.items() if t and step},
               "search": dict(self.search)}
        if not reg.stacks:
            out["note"] = ("no compiler stack is installed here" + (f" ({'; '.join(reg.skipped.values())})"
                                                                      if reg.skipped else "")
                           + f": every op runs on the per-op backend {reg.per_op.name}")
        return out

    # --- files ---------------------------------------------------------------------------
    def to_doc(self) -> dict:
        return {"segments": [vars(s) for s in self.segments], "step_seconds": self.step_seconds,
                "single": self.single, "search": self.search}

    @classmethod
    def from_doc(cls, doc, where: str) -> "Choice":
        def bad(what):
            return UsageError(f"{where}: corrupted (its -b auto choice: {what}); compile it again")
        if not isinstance(doc, dict) or not isinstance(doc.get("segments"), list) or \
                not 0 < len(doc["segments"]) <= MAX_SEGMENTS:
            raise bad("no segments")
        def seconds(v, what):
            """A time the report prints (and divides by): None, or finite and not negative."""
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
                raise bad(f"{what} = {str(v)[:40]}, not a time in seconds")
            return float(v)

        def runner(r):
            if not isinstance(r, dict) or not isinstance(r.get("backend"), str):
                raise bad("a runner-up is not {backend, seconds, how, reason}")
            return {"backend": r["backend"][:200], "seconds": seconds(r.get("seconds"), "a runner-up's seconds"),
                    "how": str(r.get("how", ""))[:100], "reason": str(r.get("reason", ""))[:1000]}
        segs = []
        for s in doc["segments"]:
            if not isinstance(s, dict) or not all(isinstance(s.get(k), str) and len(s[k]) <= 1000
                                                  for k in ("backend", "first", "last")) or \
                    type(s.get("nodes")) is not int or s["nodes"] < 1:
                raise bad("a segment is not {backend, first, last, nodes}")
            runners = s.get("runners_up") if isinstance(s.get("runners_up"), list) else []
            segs.append(Segment(s["backend"], s["first"], s["last"], s["nodes"],
                                seconds(s.get("seconds"), "a segment's seconds"), [runner(r) for r in runners],
                                str(s.get("module", ""))[:1000]))
        single = doc.get("single") if isinstance(doc.get("single"), dict) else {}
        return cls(segs, seconds(doc.get("step_seconds"), "step_seconds"),
                   {str(k)[:200]: seconds(v, "a single backend's step") for k, v in single.items()},
                   doc.get("search") if isinstance(doc.get("search"), dict) else {})
