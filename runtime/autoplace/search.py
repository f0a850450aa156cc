"""The search behind -b auto: measure candidate regions on each stack, choose by dynamic programming.

    choice = search(graph, registry, volatile=set(), budget=48)

1. Reference: the graph runs on the per-op backend (torch:cpu) on inputs made from its shapes; every value is
   kept (the candidates' inputs and the answers they must match) and every op's time (a per-op segment's cost
   is the sum of its ops').
2. Segments: the topological order is cut where the module path changes, at the deepest level that leaves at
   most MAX_DISTINCT distinct segments (a transformer's blocks are the same segment: measured once).
3. Candidates: a span of consecutive segments on a stack is the stack's regions over its claimed nodes there
   (what `-b STACK` would compile), the nodes it refuses per op. Each stack's whole graph is measured first (the
   single-stack baselines), then each distinct segment, largest first, until `budget` compiles are spent. A
   candidate that fails to compile or run, or whose outputs differ from the reference by more than TOLERANCE, is
   left out for that span with its reason.
4. Dynamic programming over the segments (Collage): best[j] = min over i < j and backend b of
   best[i] + cost(b, i..j). A span of several segments not measured is estimated (the sum of its segments, less
   the per-call cost the stack saves by merging, learnt from its whole-graph run); a chosen estimate is measured
   and the program solved again, until every chosen span is measured or the budget is spent.
A region's cost includes moving its inputs in and its outputs out, and an executor step for each.
5. Verification: the chosen placement and each single backend run end to end, interleaved in a new order each
   round; the fastest single backend wins unless the mix beats it by MIX_MARGIN (the parts measured alone can
   miss what a whole step pays: caches, thread pools waking).
Times are the process's CPU time (see cpu_ns), medians.
"""
from __future__ import annotations

import dataclasses
import gc
import random
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import first_line
from ..graph import Graph, Ref
from .choice import Choice, Segment, program_key
from .predict import predict

MAX_DISTINCT = 8          # distinct segments measured per stack (the blocks of a transformer count once)
REPEATS = 5               # timed calls per candidate, after one warm-up; the median is its time
REFERENCE_RUNS = 3
TOLERANCE = 1e-4          # a candidate's outputs vs the reference's: |a - e| <= TOLERANCE * (1 + |e|)
PRUNE = 2.0               # a stack this many times slower than op-by-op on the whole graph is not searched further
VERIFY_ROUNDS = (9, 200)  # end-to-end steps per finalist, interleaved in a new order each round: at least 9,
VERIFY_SECONDS = 1.0      # then more until the check has taken this much CPU time (a small model's medians moved
                          # 10% between checks of 9 rounds), at most 200
MIX_MARGIN = 0.03         # a mix of stacks must beat the best single backend by this much to be kept over it
# NOTE: every time here is the process's CPU time (all its threads), not wall time: on a shared machine a
# candidate descheduled mid-call would lose to a slower one that was not (wall times moved 10x under load 30).
# The stacks run one intra-op thread each when THREADS says so; a stack's idle spinning counts, as it would.
cpu_ns = time.process_time_ns


@dataclass
class Cost:
    seconds: float
    how: str                  # measured | estimated | predicted | per-op | failed
    reason: str = ""

    @property
    def usable(self) -> bool:
        return self.how != "failed"


def search(graph: Graph, reg, *, volatile=frozenset(), budget: int = 48) -> Choice:
    t0 = time.perf_counter()
    choice = _Search(graph, reg, volatile, budget).run(t0)
    # NOTE: a compiled program sits in reference cycles (its bound run method, its region's .program): without a
    # collection here the losers' sessions (5 of 6 on GPT-2) lived on until some later collection freed them, in
    # the middle of whatever step was timed then
    gc.collect()
    return choice


class _Search:
    def __init__(self, graph: Graph, reg, volatile, budget: int):
        self.graph, self.reg, self.volatile, self.budget = graph, reg, frozenset(volatile), budget
        self.per_op = reg.per_op
        self.stacks = list(reg.stacks.values())
        self.costs: dict[tuple[str, int, int], Cost] = {}
        self.by_signature: dict[tuple, Cost] = {}
        self.programs: dict = {}
        self.measured = 0
        self.failures: list[dict] = []
        self.pruned: dict[str, str] = {}

    # --- 1. the reference run ------------------------------------------------------------
    def reference(self) -> None:
        from ..executor import Executor, compile_plan
        g = self.graph
        gen = torch.Generator().manual_seed(0)
        inputs = [_example(g.slot_meta.get(s), gen) for s in g.input_slots]
        self.inputs = inputs
        plan = compile_plan(g, self.per_op, passes=[])
        ex = Executor(plan)
        values: dict[int, object] = dict(zip(g.input_slots, inputs))
        times: dict[str, list[int]] = {}

        class Keep:
            def before_op(self, call):
                self.t0 = cpu_ns()

            def after_op(self, call):
                t1 = cpu_ns()
                node = call.node
                times.setdefault(node.name, []).append(t1 - self.t0)
                if node.multi_output:
                    values.update(zip(node.outputs, call.outputs))
                elif node.outputs:
                    values[node.outputs[0]] = call.outputs
        keep = Keep()
        for _ in range(REFERENCE_RUNS):
            with ex.hooked(keep):
                ex.run(*inputs)
        fast = []
        for _ in range(REFERENCE_RUNS):
            t = cpu_ns()
            ex.run(*inputs)
            fast.append(cpu_ns() - t)
        for sl, v in g.constant_slots.items():
            values.setdefault(sl, v)
        self.values = values
        self.op_ns = [statistics.median(times.get(n.name, [0])) for n in g.nodes]
        # what the executor adds per step beyond the kernel's own time
        self.step_ns = max(0.0, (statistics.median(fast) - sum(self.op_ns)) / max(len(plan.steps), 1))

    # --- 2. segments ---------------------------------------------------------------------
    def segments(self) -> None:
        nodes = self.graph.nodes
        best, self.depth = _cut(nodes, 1), 1
        for depth in range(2, 12):
            cut = _cut(nodes, depth)
            if len({self.signature(a, b) for a, b in cut}) > MAX_DISTINCT:
                break
            best, self.depth = cut, depth
        self.cuts = best                       # [(first node index, end index)]

    def signature(self, i: int, j: int) -> tuple:
        """Same ops, shapes, arguments and wiring: the same time on a stack (the blocks of a transformer)."""
        local: dict[int, str] = {}
        consts = self.graph.constant_slots

        def name(slot):
            if slot not in local:
                m = self.graph.slot_meta.get(slot)
                kind = "c" if slot in consts else "v"
                local[slot] = f"{kind}{len(local)}:{tuple(m.shape) if m else ''}:{m.dtype if m else ''}"
            return local[slot]

        def enc(a):
            if isinstance(a, Ref):
                return name(a.slot)
            if isinstance(a, (list, tuple)):
                return tuple(enc(x) for x in a)
            return repr(a)
        parts = []
        for n in self.graph.nodes[i:j]:
            parts.append((n.op, enc(tuple(n.args)), tuple(sorted((k, enc(v)) for k, v in n.kwargs.items())),
                          tuple(name(s) for s in n.outputs)))
        return tuple(parts)

    # --- 3. candidates -------------------------------------------------------------------
    def nodes_of(self, a: int, b: int) -> tuple[int, int]:
        return self.cuts[a][0], self.cuts[b - 1][1]

    def per_op_cost(self, i: int, j: int) -> float:
        return sum(self.op_ns[i:j]) / 1e9 + (j - i) * self.step_ns / 1e9

    def regions(self, b, i: int, j: int):
        from ..regions import group
        mask = [False] * len(self.graph.nodes)
        for x in range(i, j):
            mask[x] = self.claims[b.name][x]
        return group(self.graph, mask, volatile=self.volatile)

    def cost(self, b, a: int, c: int, *, measure: bool) -> Cost | None:
        """The cost of segments a..c-1 on backend b: known, or measured now when `measure` and budget allows."""
        if b is self.per_op:
            return Cost(self.per_op_cost(*self.nodes_of(a, c)), "per-op")
        key = (b.name, a, c)
        known = self.costs.get(key)
        if known is not None and (known.how in ("measured", "failed") or not measure):
            return known
        i, j = self.nodes_of(a, c)
        sig = (b.name, self.signature(i, j))
        if sig in self.by_signature:
            self.costs[key] = self.by_signature[sig]
            return self.costs[key]
        if not measure or self.measured >= self.budget:
            return known
        self.costs[key] = self.by_signature[sig] = self.measure(b, i, j)
        return self.costs[key]

    def measure(self, b, i: int, j: int) -> Cost:
        regions = self.regions(b, i, j)
        if not regions:
            return Cost(float("inf"), "failed", f"{b.name} claims nothing here")
        self.measured += 1
        total, inside = 0.0, set()
        for r in regions:
            inside |= {id(m) for m in r.members}
            try:
                seconds = self.time_region(b, r)
            except Exception as e:       # a stack's compile or call may raise anything: left out here, with why
                why = f"{type(e).__name__}: {first_line(e)}"[:300]
                self.failures.append({"backend": b.name, "first": self.graph.nodes[i].name,
                                      "last": self.graph.nodes[j - 1].name, "reason": why})
                return Cost(float("inf"), "failed", why)
            total += seconds + (1 + len(r.inputs) + len(r.outputs)) * self.step_ns / 1e9
        rest = [x for x in range(i, j) if id(self.graph.nodes[x]) not in inside]
        total += sum(self.per_op_cost(x, x + 1) for x in rest)
        return Cost(total, "measured")

    def time_region(self, b, region) -> float:
        key = program_key(b.name, region)
        program = self.programs.get(key)
        if program is None:
            program = b.ops.program(region, saved=False)
            self.programs[key] = program
        host, dev, back = self.per_op.memory.to_host, b.memory.to_device, b.memory.to_host
        inputs = [self.values[s] for s in region.inputs]

        def call():        # as a step runs it: its inputs moved in, its outputs out (XLA's copies are not free)
            out = program(*[dev(host(v)) for v in inputs])
            return out, [back(o) for o in out]
        out, _ = call()
        for s, got in zip(region.outputs, out):
            want = np.asarray(host(self.values[s]))
            got = np.asarray(b.memory.to_host(got))
            if got.shape != want.shape:
                raise ValueError(f"output shape {got.shape} is not the reference's {want.shape}")
            if want.dtype.kind in "fc":
                err = np.abs(got.astype(np.float64) - want) - TOLERANCE * (1 + np.abs(want))
                if np.nanmax(err, initial=-1.0) > 0 or np.isnan(got).sum() != np.isnan(want).sum():
                    raise ValueError(f"outputs differ from {self.per_op.name}'s by "
                                     f"{float(np.nanmax(np.abs(got - want), initial=0)):.2e} (more than "
                                     f"{TOLERANCE:g} relative)")
            elif not np.array_equal(got, want):
                raise ValueError(f"outputs differ from {self.per_op.name}'s")
        times = []
        for _ in range(REPEATS):
            t = cpu_ns()
            call()
            times.append(cpu_ns() - t)
        return statistics.median(times) / 1e9

    # --- 4. dynamic programming ----------------------------------------------------------
    def estimate(self, b, a: int, c: int) -> Cost | None:
        """A span not measured: its segments' sum, less the per-call cost merging saves on this stack."""
        parts = [self.costs.get((b.name, x, x + 1)) for x in range(a, c)]
        if any(p is None or not p.usable for p in parts):
            return None
        total = sum(p.seconds for p in parts) - (c - a - 1) * self.saving.get(b.name, 0.0)
        return Cost(max(total, max(p.seconds for p in parts)), "estimated")

    def span_cost(self, b, a: int, c: int) -> Cost | None:
        if b is self.per_op:
            return self.cost(b, a, c, measure=False)
        known = self.costs.get((b.name, a, c))
        if known is not None:
            return known if known.usable else None
        return self.estimate(b, a, c) if c - a > 1 else None

    def solve(self, measured_only: bool = False) -> list[tuple[object, int, int, Cost]]:
        A = len(self.cuts)
        backends = [self.per_op, *self.stacks]
        best = [0.0] + [float("inf")] * A
        back: list = [None] * (A + 1)
        for j in range(1, A + 1):
            for i in range(j):
                if best[i] == float("inf"):
                    continue
                for b in backends:
                    c = self.span_cost(b, i, j)
                    if c is None or (measured_only and c.how not in ("measured", "per-op")):
                        continue
                    if best[i] + c.seconds < best[j]:
                        best[j], back[j] = best[i] + c.seconds, (b, i, c)
        path, j = [], A
        while j > 0:
            b, i, c = back[j]
            path.append((b, i, j, c))
            j = i
        return path[::-1]

    # --- the whole search ----------------------------------------------------------------
    def run(self, t0: float) -> Choice:
        self.reference()
        self.segments()
        self.claims = {b.name: [b.ops.supports(n) is True for n in self.graph.nodes] for b in self.stacks}
        A = len(self.cuts)
        predicted = 0
        for b in self.stacks:                              # the single-stack baselines
            self.cost(b, 0, A, measure=True)
        # a stack far slower than op-by-op on the whole graph is not searched per segment (IREE's compiles
        # take seconds each): it stays a candidate for the whole graph, and the report says why
        per_op = self.per_op_cost(0, len(self.graph.nodes))
        self.pruned = {b.name: f"{self.costs[(b.name, 0, A)].seconds / per_op:.1f}x slower than "
                               f"{self.per_op.name} on the whole graph" for b in self.stacks
                       if self.costs.get((b.name, 0, A)) is not None
                       and self.costs[(b.name, 0, A)].seconds > PRUNE * per_op}
        searched = [b for b in self.stacks if b.name not in self.pruned]
        order = sorted(range(A), key=lambda a: -self.per_op_cost(*self.nodes_of(a, a + 1)))
        for a in order if A > 1 else ():                   # each distinct segment, largest first
            for b in searched:
                if (b.name, a, a + 1) in self.costs:
                    continue
                guess = predict(b.name, self.regions(b, *self.nodes_of(a, a + 1)))
                if guess is not None:
                    self.costs[(b.name, a, a + 1)] = Cost(guess, "predicted")
                    predicted += 1
                else:
                    self.cost(b, a, a + 1, measure=True)
        self.saving = {}
        for b in self.stacks:                              # what one call fewer saves on this stack
            whole = self.costs.get((b.name, 0, A))
            parts = [self.costs.get((b.name, a, a + 1)) for a in range(A)]
            if A > 1 and whole is not None and whole.usable and all(p is not None and p.usable for p in parts):
                self.saving[b.name] = max(0.0, (sum(p.seconds for p in parts) - whole.seconds) / (A - 1))
        while True:                                        # measure what the program chose on estimates
            path = self.solve()
            todo = [(b, a, c) for b, a, c, cost in path if cost.how in ("estimated", "predicted")]
            if not todo or self.measured >= self.budget:
                break
            for b, a, c in todo:
                self.cost(b, a, c, measure=True)
        return self.verify(self.solve(measured_only=True), t0, predicted)

    def segments_of(self, path) -> list[Segment]:
        """The program's path as segments; consecutive spans on the same backend run per op are one segment."""
        from ..regions import _common_path
        nodes, spans = self.graph.nodes, []
        for b, a, c, cost in path:
            if spans and spans[-1][0] is b is self.per_op:
                spans[-1][2] = c
            else:
                spans.append([b, a, c])
        out = []
        for b, a, c in spans:
            i, j = self.nodes_of(a, c)
            own = self.span_cost(b, a, c)
            runners = []
            for other in [self.per_op, *self.stacks]:
                if other is not b:
                    oc = self.costs.get((other.name, a, c)) if other is not self.per_op else self.span_cost(other, a, c)
                    runners.append({"backend": other.name, "seconds": oc.seconds if oc and oc.usable else None,
                                    "how": oc.how if oc else "not measured",
                                    "reason": oc.reason if oc else self.pruned.get(other.name, "")})
            runners.sort(key=lambda r: (r["seconds"] is None, r["seconds"] or 0))
            out.append(Segment(b.name, nodes[i].name, nodes[j - 1].name, j - i, own.seconds if own else None,
                               runners, _common_path([n.module_path for n in nodes[i:j]])))
        return out

    def verify(self, path, t0: float, predicted: int) -> Choice:
        """The chosen placement and every single backend, each planned and run end to end, interleaved: the
        fastest is the choice (a sum of parts measured alone can miss what a whole step pays)."""
        from ..executor import Executor, compile_plan
        A = len(self.cuts)
        options = {self.per_op.name: self.segments_of([(self.per_op, 0, A, None)])}
        for b in self.stacks:
            whole = self.costs.get((b.name, 0, A))
            if whole is not None and whole.usable:
                options[b.name] = self.segments_of([(b, 0, A, whole)])
        chosen = self.segments_of(path)
        same = [n for n, segs in options.items() if _spans(segs) == _spans(chosen)]
        if not same:                       # the program chose a mix: it runs beside every single backend
            options["auto"] = chosen
        runs = {}
        for name, segs in list(options.items()):
            reg_backend = self.reg.with_choice(Choice(segs, programs=self.programs))
            g = dataclasses.replace(self.graph, slot_meta=dict(self.graph.slot_meta))
            try:
                ex = Executor(compile_plan(g, reg_backend, passes=[], carry={v: v for v in self.volatile}))
                ex.run(*self.inputs)
            except Exception as e:         # a placement the parts passed but the whole fails: not a candidate
                self.failures.append({"backend": name, "first": "", "last": "", "reason":
                                      f"the whole step failed: {type(e).__name__}: {first_line(e)}"[:300]})
                del options[name]
                continue
            runs[name] = ex
        times = {name: [] for name in runs}
        # NOTE: a new order each round: a step pays for what ran before it (caches another placement's weights
        # filled); in a fixed order one finalist always follows the same other and carries its cost (0.15 ms
        # of GPT-2's 0.6 ms)
        order, shuffle = list(runs), random.Random(0).shuffle
        least, most = VERIFY_ROUNDS
        start = cpu_ns()
        for r in range(most):
            if r >= least and cpu_ns() - start > VERIFY_SECONDS * 1e9:
                break
            shuffle(order)
            for name in order:
                t = cpu_ns()
                runs[name].run(*self.inputs)
                times[name].append(cpu_ns() - t)
        step = {name: statistics.median(ts) / 1e9 for name, ts in times.items()}
        best = keep(step)
        single = {n: t for n, t in step.items() if n != "auto"}
        segments = options[best]
        predicted_step = sum(s.seconds or 0 for s in chosen)
        search = {"seconds": time.perf_counter() - t0, "candidates_measured": self.measured,
                  "candidates_predicted": predicted, "budget": self.budget, "segments": A,
                  "module_depth": self.depth, "distinct_segments": len({self.signature(*ab) for ab in self.cuts}),
                  "failed": self.failures, "not_searched": self.pruned, "repeats": REPEATS,
                  "verify_rounds": len(times[best]), "threads": torch.get_num_threads(),
                  "winner": best, "searched_placement": {"predicted_seconds": predicted_step,
                                                         "measured_seconds": step.get(same[0] if same else "auto"),
                                                         "same_as": same[0] if same else None}}
        # only the winner's programs stay alive: the other candidates' compiled sessions (arenas, thread pools,
        # executables) would otherwise live as long as the plan
        used = {id(st.kernel) for st in runs[best].plan.steps}
        programs = {k: p for k, p in self.programs.items() if id(p) in used}
        self.programs.clear()
        runs.clear()
        self.values.clear()       # (the reference run's hook holds this dict too, in a cycle the GC frees late)
        return Choice(segments, step[best], single, search, "search", programs)


def keep(step: dict[str, float]) -> str:
    """The finalist to keep from their measured steps: the fastest single backend, unless the mix ("auto") beats
    it by more than MIX_MARGIN -- a mix within the noise of one stack is not worth its extra regions and transfers
    (a split of one stack's graph in two won GPT-2's check on noise and then ran slower)."""
    single = {n: t for n, t in step.items() if n != "auto"}
    if not single:
        return "auto"
    best = min(single, key=single.get)
    return "auto" if "auto" in step and step["auto"] < single[best] * (1 - MIX_MARGIN) else best


def _spans(segments) -> list[tuple]:
    return [(s.backend, s.first, s.last) for s in segments]


def _cut(nodes, depth: int) -> list[tuple[int, int]]:
    """Runs of nodes whose module path agrees on its first `depth` parts (a node with no path joins the run
    before it)."""
    out, key = [], None
    for x, n in enumerate(nodes):
        k = ".".join(n.module_path.split(".")[:depth]) if n.module_path else key
        if not out or k != key:
            out.append([x, x + 1])
        else:
            out[-1][1] = x + 1
        key = k
    return [tuple(r) for r in out]


def _example(meta, gen):
    from ..dtypes import to_torch
    if meta is None:
        return torch.zeros(())
    dt = to_torch(meta.dtype)
    if dt.is_floating_point or dt.is_complex:
        return torch.randn(meta.shape, generator=gen).to(dt)
    return torch.ones(meta.shape, dtype=dt)       # ids, masks, labels: 1 is in range for every one of them

