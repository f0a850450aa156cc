"""What-if at scale: step time and memory per rank at N ranks, from measured op costs and a collective model.

    m = measure("demo:gpt", ["sim:npu-a1"], [1.0])             # per-op costs of one step, per backend
    p = predict(m, ranks=1024, link=Interconnect(1e11, 5e-6, "ring"), strategy="zero3", overlap=True)
    p["step_seconds"], p["memory"], p["communication_share"], p["scaling_efficiency"]
    search_strategies(m, 8, link)                                # every strategy that fits 8 ranks, ranked

Calibration: a share's compute is one training step of its rows on its backend, forward, backward and
optimizer apart: the roofline clock for sim chips (their StepClock, exact), the step's wall time on a
wall-clock backend (there host and device are one: what the rank spends); the link comes from the
description's [interconnect], `--measure-link` (runtime/dist/linkbench.py) or flags. Collectives:
runtime/dist/collectives.py; strategies and memory: runtime/dist/strategies.py. The modelled step is
`opscope train --hybrid`'s: on top of the strategy's compute and exposed communication, each step
flattens and scales the gradients and fingerprints the parameters (host work, measured here) and runs
two latency-bound collectives (the loss all-reduce and the parameter-check all-gather).

    measure(..., together=True)       # host ranks: timed in one process each, in lockstep (together.py)
    predict(m, 2, link, cores_per_node=2)

Ranks of one host share its cores. `together` times the shares as the job's ranks run (the cores shared, a
phase the slowest rank's per step) and the latency of their own small all-reduce; `cores_per_node` stretches
compute, host work and the loopback link past what the shares and the link (Interconnect.ranks) were measured
with, and lets an overlapped collective hide only as much as the cores the ranks leave free allow (gloo's
threads copy and sum on the same cores as the compute).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace

from ..errors import UsageError
from ..safe_read import MAX_RANKS
from .collectives import TOPOLOGIES, Cluster, Interconnect, Level, all_reduce_seconds  # noqa: F401 (API)
from .share_timer import ShareTimer, share_inputs
from .shape import ModelShape
from .strategies import Strategy, candidates, plan

DEFAULT_LINK = {"bandwidth": 2.5e10, "latency": 5e-6, "topology": "ring"}     # a PCIe 4 x16 class link
DEFAULT_SOURCE = "default (PCIe 4 x16 class: 25 GB/s, 5 us, ring)"


def link_of(backend_list, stored: dict | None = None, **override) -> Interconnect:
    """Flags over the first description's [interconnect], over this host's measured link, over the default."""
    base, source = dict(DEFAULT_LINK), DEFAULT_SOURCE
    for b in backend_list:
        table = getattr(getattr(b, "description", None), "interconnect", None)
        if table:
            base.update({k: v for k, v in table.items() if k in DEFAULT_LINK})
            source = f"[interconnect] of {b.name}"
            break
    else:
        if stored:
            base.update(bandwidth=stored["bandwidth"], latency=stored["latency"], topology="ring")
            source = f"measured on {stored.get('host', 'this host')} at {stored.get('measured_at', '?')} (--measure-link)"
    given = {k: v for k, v in override.items() if v is not None}
    if given:
        source += " with " + ", ".join(f"{k}={v}" for k, v in given.items())
    base.update(given)
    # the ranks it was measured with on this host (a hand-edited file's odd value reads as not measured here)
    r = stored.get("ranks") if stored and source.startswith("measured") and not given else 0
    measured_here = r if isinstance(r, int) and not isinstance(r, bool) and 0 < r <= MAX_RANKS else 0
    return Interconnect(float(base["bandwidth"]), float(base["latency"]), base.get("topology", "ring"), source,
                        measured_here)



def inter_node_of(backend_list) -> tuple[int, Interconnect] | None:
    """The first description's second level ([interconnect] ranks_per_node, inter_node_*), if it has one."""
    for b in backend_list:
        ic = getattr(getattr(b, "description", None), "interconnect", None) or {}
        if "ranks_per_node" in ic:
            return int(ic["ranks_per_node"]), Interconnect(float(ic["inter_node_bandwidth"]),
                                                           float(ic["inter_node_latency"]),
                                                           ic.get("inter_node_topology", "ring"),
                                                           f"[interconnect] inter_node_* of {b.name}")
    return None


@dataclass
class Measured:
    model: str
    shares: list[dict]              # backend, rows, compute/forward/backward/optimizer/host seconds, clock, ops
    gradient_bytes: int
    parameters: int
    shapes: list[ModelShape] = field(default_factory=list)
    optimizer: str = "sgd"
    threads: int = 1
    together: int = 1               # ranks whose steps were timed at once on this host (together.py)
    small_collective_seconds: float | None = None    # ... and what a latency-bound collective cost among them

    @property
    def compute_seconds(self) -> float:
        return max(s["compute_seconds"] for s in self.shares)

    @property
    def slowest(self) -> int:
        return max(range(len(self.shares)), key=lambda i: self.shares[i]["compute_seconds"])


def rank_threads(world: int) -> int:
    """The torch threads each rank of `train --hybrid` over `world` ranks gets (launch.py's rule: the
    OMP_NUM_THREADS asked, else the rank's share of this host's cores)."""
    from .launch import threads_per_rank
    asked = os.environ.get("OMP_NUM_THREADS", "")
    return int(asked) if asked.isdigit() and int(asked) > 0 else threads_per_rank(world)


def measure(model_spec: str, specs: list[str], ratios: list[float], *, repeats: int = 5,
            optimizer: str = "sgd", threads: int | None = None, together: bool = False) -> Measured:
    """Time one training step of each backend's share in this process (the median of `repeats`, after a
    warm-up), with its phases, its host bookkeeping, and its model shape; with the torch threads each rank
    will get (`threads`, default rank_threads(len(specs))): this process's default of a thread per core
    made demo:cnn's compute 29-65x off on 2 ranks, whose ranks run one thread each.
    together: the shares are ranks on this host (wall-clock backends): each is timed in its own process while
    the others run theirs (together.py), as the job's ranks share the cores."""
    import torch
    threads = threads or rank_threads(len(specs))
    extra = {}
    if together and len(specs) > 1 and all(_clock(s) == "wall" for s in specs):
        from .together import measure_together
        shares, shapes, small = measure_together(model_spec, specs, ratios, repeats=repeats, optimizer=optimizer,
                                                 threads=threads)
        extra = {"together": len(specs), "small_collective_seconds": small}
    else:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            shares, shapes = _measure(model_spec, specs, ratios, repeats, optimizer)
        finally:
            torch.set_num_threads(before)
    s0 = shapes[0]
    return Measured(model_spec, shares, s0.grad_bytes, sum(s // 4 for s in s0.param_sizes), shapes, optimizer,
                    threads, **extra)


def _clock(spec: str) -> str:
    from .. import backends
    from ..step_clock import clock_name
    return clock_name(backends.resolve(spec))


def _measure(model_spec: str, specs: list[str], ratios: list[float], repeats: int,
             optimizer: str) -> tuple[list[dict], list[ModelShape]]:
    """Each share timed in this process (ShareTimer), and its model shape."""
    from .. import models

    model, inputs = models.load_train(model_spec)
    shares, shapes, seen = [], [], {}
    for spec, local in zip(specs, share_inputs(inputs, ratios)):
        n = int(local[0].shape[0])
        if (spec, n) in seen:                 # two ranks on one backend with equal rows: one measurement
            shares.append(dict(shares[seen[spec, n]]))
            shapes.append(shapes[seen[spec, n]])
            continue
        seen[spec, n] = len(shares)
        timer = ShareTimer(model, model_spec, spec, local, optimizer)
        shares.append(timer.time(repeats))
        shapes.append(timer.shape)
    return shares, shapes


def cluster_of(ranks: int, link: Interconnect, inter: Interconnect | None = None,
               ranks_per_node: int | None = None) -> Cluster:
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise UsageError(f"--ranks must be a positive integer (got {ranks})")
    if inter is None or not ranks_per_node or ranks <= ranks_per_node:
        return Cluster([Level(ranks, link)])
    return Cluster.of(ranks, [Level(ranks_per_node, link), Level(0, inter)])


def _crowd(ranks: int, threads: int, cores: int | None) -> float:
    """How much slower a wall-clock rank runs when `ranks` of them at `threads` each share `cores` cores."""
    return max(1.0, ranks * threads / cores) if cores else 1.0


def predict(m: Measured, ranks: int, link: Interconnect | Cluster, *, strategy: str | Strategy = "dp",
            overlap: bool = False, bucket_bytes: int = 25 * 2 ** 20, microbatches: int | None = None,
            cores_per_node: int | None = None) -> dict:
    cluster = link if isinstance(link, Cluster) else cluster_of(ranks, link)
    strat = strategy if isinstance(strategy, Strategy) else Strategy.parse(strategy)
    host_ranks = all(s["clock"] == "wall" for s in m.shares)
    per_node = cluster.levels[0].size
    # ranks of one node share its cores: past them a wall-clock rank's compute stretches, beyond what the shares
    # were measured with (m.together ranks timed at once already paid their crowd)
    crowd = _crowd(per_node, m.threads, cores_per_node) / _crowd(m.together, m.threads, cores_per_node)
    inner = cluster.levels[0]
    if m.small_collective_seconds and host_ranks and per_node == m.together > 1:
        # the latency as the job meets it: a small all-reduce where the ranks met while their steps were timed
        # together (wake-ups on shared cores, skew), not a micro-benchmark's back-to-back one
        a = m.small_collective_seconds / (2 * (per_node - 1))
        why = f", latency {a * 1e6:.0f} us from the ranks' own small all-reduce ({per_node} timed together)"
        inner = Level(inner.size, replace(inner.link, latency=a, source=inner.link.source + why))
        cluster = Cluster([inner] + cluster.levels[1:])
    link_crowd = _crowd(per_node, m.threads, cores_per_node) / _crowd(inner.link.ranks or 1, m.threads, cores_per_node)
    if link_crowd != 1 and host_ranks:
        # host ranks past the cores: a loopback collective is the cores' copying and each hop waits for one
        slowed = replace(inner.link, bandwidth=inner.link.bandwidth / link_crowd,
                         latency=inner.link.latency * link_crowd,
                         source=inner.link.source + f" (its cores shared {link_crowd:g}x)")
        cluster = Cluster([Level(inner.size, slowed)] + cluster.levels[1:])
    # host ranks whose threads fill the cores leave none for gloo's threads to send beside the compute
    spare = (max(0, cores_per_node - per_node * m.threads) / per_node) if cores_per_node and host_ranks else 1.0
    hidden = min(1.0, spare)
    per_share = []
    for share, shape in zip(m.shares, m.shapes):
        stretch = crowd if share["clock"] == "wall" else 1.0
        s = {**share, **{k: share[k] * stretch for k in ("forward_seconds", "backward_seconds", "optimizer_seconds")}}
        per_share.append(plan(strat, s, shape, cluster, overlap=overlap, bucket_bytes=bucket_bytes,
                              microbatches=microbatches, hidden=hidden))
    worst = max(range(len(per_share)), key=lambda i: per_share[i]["compute_seconds"])
    p = dict(per_share[worst])
    p["memory"] = {k: max(q["memory"][k] for q in per_share) for k in p["memory"]}
    n = cluster.ranks
    control = 2 * cluster.all_reduce(8 * (1 + 3 * n)) if n > 1 else 0.0     # loss all-reduce, digest all-gather
    # host bookkeeping is wall time: it adds to a wall-clock rank's step, never to a sim chip's clock
    host = max((s["host_seconds"] for s in m.shares if s["clock"] == "wall"), default=0.0) * crowd if n > 1 else 0.0
    if control:
        p["collectives"] = p["collectives"] + [{"what": "loss all-reduce and parameter-check all-gather (latency)",
                                                "bytes": 16 * (1 + 3 * n), "ranks": n, "seconds": control,
                                                "exposed": control}]
    comm = p["exposed_communication_seconds"] + control
    compute = p["compute_seconds"]
    step = compute + comm + host
    link0 = cluster.levels[-1].link
    rows = sum(s["rows"] for s in m.shares)
    p.update({"model": m.model, "ranks": n, "overlap": overlap, "shares": m.shares, "gradient_bytes": m.gradient_bytes,
              "parameters": m.parameters, "interconnect": asdict(link0), "cluster": cluster.describe(),
              "communication_seconds": comm, "host_seconds": host, "step_seconds": step,
              "communication_share": comm / step if step > 0 else 0.0,
              "scaling_efficiency": compute / step if step > 0 else 1.0,
              "rows_per_second": n * rows / len(m.shares) / step if step > 0 else 0.0,
              "overlap_hidden": hidden if overlap else None,
              "assumptions": assumptions(m, cluster, strat, overlap, bucket_bytes, cores_per_node)})
    return p


def search_strategies(m: Measured, ranks: int, link, *, capacity: float | None = None, **kw) -> list[dict]:
    """Every strategy that fits `ranks` ranks, predicted as `predict` does: those that fit in memory
    (`capacity` bytes per rank) first, then the fastest."""
    cluster = link if isinstance(link, Cluster) else cluster_of(ranks, link)
    rows = []
    for s in candidates(cluster.ranks, m.shapes[m.slowest]):
        p = predict(m, cluster.ranks, cluster, strategy=s, **kw)
        p["fits"] = capacity is None or p["memory"]["total"] <= capacity
        rows.append(p)
    rows.sort(key=lambda p: (not p["fits"], p["step_seconds"], p["memory"]["total"]))
    return rows


def assumptions(m: Measured, cluster: Cluster, strat: Strategy, overlap: bool, bucket_bytes: int,
                cores_per_node) -> list[str]:
    levels = "; ".join(f"{c['level']}: {c['ranks']} x {c['bandwidth'] / 1e9:g} GB/s, {c['latency'] * 1e6:g} us, "
                       f"{c['topology']} ({c['source']})" for c in cluster.describe())
    out = [
        "weak scaling: every rank keeps its rows; the global batch grows with the ranks",
        "compute per step = the slowest share's forward + backward + optimizer (synchronous), on its backend's "
        "clock: " + ", ".join(f"{s['backend']} {s['clock']}" for s in m.shares),
        f"strategy {strat.name}: memory and collectives as in runtime/dist/strategies.py",
        (f"gradients in buckets of {bucket_bytes / 2 ** 20:g} MiB overlapped with backward (what runs past its "
         "end is exposed)") if overlap else "gradient collectives after backward, not overlapped (an upper bound)",
        f"links: {levels}",
        "ring 2(n-1)/n*B/W + 2(n-1)*a; pipelined double-binary tree 2d(a + B/2kW) + (k-1)(a + V/kW); "
        "reduce-scatter/all-gather (n-1)/n*B/W + (n-1)*a; hierarchical RS(intra) + AR(inter, B/g) + AG(intra)",
        "per step also (train --hybrid's trainer): 2 latency-bound collectives, and on wall-clock ranks its host "
        "bookkeeping (gradient flatten, parameter digest; measured)",
        "links uncontended; no failures" + ("" if m.together > 1 else "; no stragglers"),
    ]
    if cores_per_node:
        out.append(f"{cores_per_node} cores per node shared by its ranks at {m.threads} thread(s) each: past them, "
                   "wall-clock compute and host work stretch, and the intra-node link slows, by ranks x threads / "
                   "cores (beyond the ranks the shares and the link were measured with); an overlapped collective's "
                   "byte work (copy, sum) hides only as far as the cores the ranks leave free allow, its latency hides")
    if m.together > 1:
        out.append(f"the shares were timed together, {m.together} processes stepping in lockstep on this host: each "
                   "phase is the slowest rank's per step (stragglers included)")
    return out
