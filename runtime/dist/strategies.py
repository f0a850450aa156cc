"""Parallel strategies: step time and memory per rank for dp, ZeRO-1/2/3, tensor and pipeline parallel.

    s = Strategy.parse("tp=2"); s.check(ranks=8, shape=shape)     # UsageError (exit 2) when it does not fit
    p = plan(s, share, shape, cluster, overlap=True, bucket_bytes=25 * 2**20)
    p["step_seconds"], p["memory"]["total"], p["collectives"]
    candidates(8, shape)                                          # what `--strategy search` tries on 8 ranks

Weak scaling throughout: each rank brings the rows of its measured share, so every strategy trains the
same global batch (a tp or pp group of t ranks processes t shares' rows), and compute grows linearly
with the rows. P, G, S, A: bytes of parameters, gradients, optimizer state and activations saved for
backward, from the captured training graph (runtime/dist/simulate.py: ModelShape); F, Bk, O: the share's
forward, backward and optimizer seconds on its backend's clock.

    dp       memory P + G + S + A;        comm all-reduce G (bucketed, overlappable with backward)
    zero1    memory P + G + S/n + A;      all-reduce G (overlappable), optimizer O/n, all-gather P
    zero2    memory P + G/n + S/n + A;    reduce-scatter G (overlappable), O/n, all-gather P
    zero3    memory (P + G + S)/n + A + 2 x the largest layer's parameters (gathered, and the one prefetched);
             all-gather P in forward and again in backward, reduce-scatter G; with --overlap each layer's
             gather is prefetched during the previous layer's compute
    tp=t     memory (P + G + S + A)/t (Megatron splits every linear; activations at best /t);
             per row-parallel linear (every second 2-D weight of a layer: the out projections) one
             all-reduce of its output in forward and one in backward inside the tp group, not overlapped;
             gradients G/t all-reduced by the n/t data-parallel peers
    pp=p     contiguous stages of near-equal layers; 1F1B over m microbatches:
             (m + p - 1) / m x the largest stage's share of (F + Bk) for p shares' rows, plus 2 activation
             sends per microbatch step (a + bytes/W); stage 0 holds min(p, m) microbatches' activations;
             the stage's G all-reduced by the n/p data-parallel peers
Bucketed overlap: gradients fill buckets (reverse parameter order, the bucket size) evenly over the
backward; each bucket's collective starts when it is full and the previous one is done; only what runs
past the end of backward is exposed (overlap hides up to the backward's length). On host ranks with no
free core a bucket's byte work (copy, sum) runs on the compute's cores: only its latency hides.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import UsageError
from .collectives import Cluster

KINDS = ("dp", "zero1", "zero2", "zero3")
HELP = "dp, zero1, zero2, zero3, tp=N, pp=N, or search"


@dataclass(frozen=True)
class Strategy:
    kind: str
    degree: int = 1

    @property
    def name(self) -> str:
        return self.kind if self.kind in KINDS else f"{self.kind}={self.degree}"

    @classmethod
    def parse(cls, text: str) -> "Strategy":
        t = (text or "").strip().lower()
        if t in KINDS:
            return cls(t)
        m = re.fullmatch(r"(tp|pp)\s*=\s*(\d+)", t)
        if not m or int(m.group(2)) < 1:
            raise UsageError(f"--strategy {text!r}: expected {HELP} (N a positive integer)")
        return cls(m.group(1), int(m.group(2)))

    def check(self, ranks: int, shape=None) -> None:
        """UsageError when this strategy does not fit the ranks (or, given a shape, the model's layers)."""
        d = self.degree
        if self.kind in ("tp", "pp") and (d > ranks or ranks % d):
            fits = [k for k in range(1, ranks + 1) if ranks % k == 0]
            raise UsageError(f"--strategy {self.name} does not fit {ranks} rank(s): {self.kind}=N needs N to divide "
                             f"the ranks (here {', '.join(f'{self.kind}={k}' for k in fits)})")
        if self.kind == "pp" and shape is not None and d > len(shape.layers):
            raise UsageError(f"--strategy {self.name}: {shape.model} has {len(shape.layers)} layer(s) "
                             f"({', '.join(lay.name for lay in shape.layers[:6])}{', ...' if len(shape.layers) > 6 else ''}); "
                             f"a pipeline stage needs at least one (use pp <= {len(shape.layers)})")


def candidates(ranks: int, shape) -> list[Strategy]:
    """What `--strategy search` tries on `ranks` ranks: every strategy that fits them."""
    out = [Strategy(k) for k in KINDS]
    out += [Strategy("tp", d) for d in range(2, ranks + 1) if ranks % d == 0]
    out += [Strategy("pp", d) for d in range(2, min(ranks, len(shape.layers)) + 1) if ranks % d == 0]
    return out


def overlapped(items: list[tuple[float, float]], window: float) -> float:
    """Exposed seconds of collectives that become ready during a compute window of `window` seconds:
    items (ready fraction of the window, seconds), run one after another in that order."""
    end = 0.0
    for ready, seconds in items:
        end = max(end, ready * window) + seconds
    return max(0.0, end - window) if items else 0.0


def prefetched(layers: list[tuple[float, float]]) -> float:
    """Exposed seconds when each layer's parameters are gathered (seconds) while the previous layer computes
    (its compute seconds): (gather, compute) per layer in execution order."""
    comm_end = compute_end = busy = 0.0
    for gather, compute in layers:
        comm_end += gather                           # gathers run back to back, ahead of the compute
        compute_end = max(compute_end, comm_end) + compute
        busy += compute
    return compute_end - busy


def buckets(sizes: list[int], cap: int) -> list[int]:
    """Bucket bytes in reverse parameter order (runtime/dist/buckets.py's rule: a new bucket once full)."""
    out, filled = [0], 0
    for size in reversed(sizes):
        if filled >= max(1, cap):
            out.append(0)
            filled = 0
        out[-1] += size
        filled += size
    return [b for b in out if b]


def plan(strategy: Strategy, share: dict, shape, cluster: Cluster, *, overlap: bool = False,
         bucket_bytes: int = 25 * 2 ** 20, microbatches: int | None = None, hidden: float = 1.0) -> dict:
    """hidden: the share of an overlapped collective's byte work that can run beside the compute (1: the link
    works on its own; host ranks whose threads fill every core have none to spare: gloo's copying and summing
    wait for the compute's core, and only the latency, spent waiting, still hides)."""
    n, kind, d = cluster.ranks, strategy.kind, strategy.degree
    strategy.check(n, shape)
    F, Bk, O = share["forward_seconds"], share["backward_seconds"], share["optimizer_seconds"]
    P, G, S, A = shape.param_bytes, shape.grad_bytes, shape.state_bytes, shape.activation_bytes
    colls: list[dict] = []

    def coll(what, seconds, nbytes, group, exposed):
        colls.append({"what": what, "bytes": int(nbytes), "ranks": group, "seconds": seconds, "exposed": exposed})
        return exposed

    def gradients(what, cost, group_ranks, grads_bytes, window):
        """Bucketed gradient collective: overlapped with the backward when asked."""
        sizes = buckets(shape.grad_sizes(grads_bytes / max(G, 1)), bucket_bytes) if overlap else [grads_bytes]
        total, at, items, serial = 0.0, 0, [], 0.0
        for size in sizes:
            at += size
            t = cost(size)
            total += t
            # the latency part is waiting (gloo's thread sleeps) and hides as the link allows; the bytes part is
            # copying and summing, which hides only as far as the cores are free (`hidden`)
            wait = min(t, cost(1))
            items.append((at / max(grads_bytes, 1), wait + hidden * (t - wait)))
            serial += (1 - hidden) * (t - wait)
        exposed = overlapped(items, window) + serial if overlap else total
        return coll(what + (f" ({len(sizes)} buckets)" if overlap else ""), total, grads_bytes, group_ranks, exposed)

    compute, exposed = F + Bk + O, 0.0
    if kind in KINDS:
        memory = {"parameters": P, "gradients": G, "optimizer_state": S, "activations": A}
        if kind == "dp":
            exposed += gradients("all-reduce of the gradients", cluster.all_reduce, n, G, Bk)
        else:
            compute = F + Bk + O / n
            memory["optimizer_state"] = S / n
            if kind == "zero1":
                exposed += gradients("all-reduce of the gradients", cluster.all_reduce, n, G, Bk)
            elif kind == "zero2" or kind == "zero3":
                memory["gradients"] = G / n
                if kind == "zero2":
                    exposed += gradients("reduce-scatter of the gradients", cluster.reduce_scatter, n, G, Bk)
            if kind == "zero3":
                memory["parameters"] = P / n + 2 * max(lay.param_bytes for lay in shape.layers)
                fwd = [(cluster.all_gather(lay.param_bytes), F * lay.share) for lay in shape.layers]
                bwd = [(cluster.all_gather(lay.param_bytes) + cluster.reduce_scatter(lay.grad_bytes), Bk * lay.share)
                       for lay in reversed(shape.layers)]
                for what, items, nbytes in (("all-gather of the parameters in forward", fwd, P),
                                            ("all-gather of the parameters and reduce-scatter of the gradients in "
                                             "backward", bwd, P + G)):
                    total = sum(g for g, _ in items)
                    exposed += coll(what, total, nbytes, n,
                                    hidden * prefetched(items) + (1 - hidden) * total if overlap else total)
            else:
                ag = cluster.all_gather(P)
                exposed += coll("all-gather of the updated parameters", ag, P, n, ag)
    elif kind == "tp":
        group, peers = cluster.sub(d), cluster.strided(n // d, d)
        memory = {"parameters": P / d, "gradients": G / d, "optimizer_state": S / d, "activations": A / d}
        compute = F + Bk + O / d
        acts = [shape.tokens * d * out * 4 for out in shape.row_parallel_outputs()]
        tp_s = 2 * sum(group.all_reduce(b) for b in acts)
        exposed += coll(f"all-reduce of {len(acts)} row-parallel outputs, forward and backward", tp_s,
                        2 * sum(acts), d, tp_s)
        exposed += gradients("all-reduce of the gradients (data-parallel peers)", peers.all_reduce, n // d, G / d, Bk)
    else:                                      # pp
        stages = shape.stages(d)
        m = microbatches or min(4 * d, max(1, share["rows"] * d))
        if m > share["rows"] * d:
            raise UsageError(f"--microbatches {m}: a pipeline of {d} shares has {share['rows'] * d} rows")
        worst = max(stages, key=lambda st: st["flops_share"])
        peers, link = cluster.strided(n // d, d), cluster.sub(d).levels[-1].link
        f = worst["flops_share"]
        compute = (m + d - 1) / m * f * d * (F + Bk) + O * worst["param_share"]
        act = shape.tokens * d / m * shape.width * 4
        send = 2 * (m + d - 1) * (link.latency + act / link.bandwidth) if d > 1 else 0.0
        exposed += coll(f"activation sends between {d} stages ({m} microbatches)", send, act * 2 * m, 2, send)
        Gs = G * worst["param_share"]
        exposed += gradients("all-reduce of the stage's gradients (data-parallel peers)", peers.all_reduce, n // d, Gs,
                             Bk * f * d)
        memory = {"parameters": P * worst["param_share"], "gradients": Gs,
                  "optimizer_state": S * worst["param_share"],
                  "activations": A * f * d * min(d, m) / m}
    memory["total"] = sum(memory.values())
    comm = sum(c["seconds"] for c in colls)
    step = compute + exposed
    return {"strategy": strategy.name, "ranks": n, "step_seconds": step, "compute_seconds": compute,
            "communication_seconds": comm, "exposed_communication_seconds": exposed,
            "communication_share": exposed / step if step > 0 else 0.0,
            "memory": {k: int(v) for k, v in memory.items()}, "collectives": colls}

