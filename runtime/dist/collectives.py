"""The collective cost model: seconds for all-reduce, reduce-scatter and all-gather of B bytes.

    link = Interconnect(1e9, 1e-5, "ring")                     # bytes/s, seconds per message, topology
    all_reduce_seconds(2**20, 8, link)
    cluster = Cluster.of(8, [Level(4, nvlink), Level(2, ethernet)])   # 4 ranks per node, 2 nodes
    cluster.all_reduce(2**20), cluster.reduce_scatter(2**20), cluster.all_gather(2**20)

Alpha-beta formulas (W bandwidth of a rank's link, a latency per message, n ranks, d = ceil(log2 n)):
    ring all-reduce      2(n-1)/n * B/W + 2(n-1) * a        (reduce-scatter then all-gather around the ring)
    tree all-reduce      NCCL's double binary tree, pipelined in k chunks: each tree carries B/2; the first
                         chunk climbs d levels and comes back down (2d hops of B/(2k)), every later chunk costs
                         the busiest link's share of it, a + V/(kW), V = B at 2 ranks (the trees' halves cross
                         in opposite directions) and 2B above (NCCL: tree bus bandwidth is half the link's):
                             2d * (a + B/(2kW)) + (k-1) * (a + V/(kW)),   k in 1..64 the fastest
                         (at 2 ranks and k = 1 this is B/W + 2a, the ring's time: a tree never loses there)
    all-to-all           2(n-1)/n * B/W + 2 * a              (every peer at once)
    reduce-scatter and all-gather (ring, whatever the topology, as NCCL):  (n-1)/n * B/W + (n-1) * a
      with B the full (unsharded) size.
    hierarchical (levels innermost first: g ranks per node on the intra-node link, N nodes on the
    inter-node one; the g ranks of a node share its inter-node link):
        all-reduce = RS_intra(B) + AR_inter(B/g over N, at W_inter/g each) + AG_intra(B)
        reduce-scatter = RS_intra(B) + RS_inter(B/g, W_inter/g); all-gather mirrors it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import UsageError

TOPOLOGIES = ("ring", "tree", "all-to-all")
MAX_CHUNKS = 64


@dataclass
class Interconnect:
    bandwidth: float
    latency: float
    topology: str = "ring"
    source: str = "default"
    ranks: int = 0              # measured on this host with this many ranks sharing its cores (0: not measured here)

    def __post_init__(self):
        if not (isinstance(self.bandwidth, (int, float)) and self.bandwidth > 0 and math.isfinite(self.bandwidth)):
            raise UsageError(f"interconnect bandwidth must be a positive number of bytes/s (got {self.bandwidth})")
        if not (isinstance(self.latency, (int, float)) and self.latency >= 0 and math.isfinite(self.latency)):
            raise UsageError(f"interconnect latency must be >= 0 seconds (got {self.latency})")
        if self.topology not in TOPOLOGIES:
            raise UsageError(f"interconnect topology {self.topology!r}: use one of {', '.join(TOPOLOGIES)}")

    def shared_by(self, ranks: int) -> "Interconnect":
        """The share of this link each of `ranks` ranks gets when they send at once."""
        return replace(self, bandwidth=self.bandwidth / max(1, ranks))


def tree_all_reduce_seconds(nbytes: float, n: int, w: float, a: float) -> tuple[float, int]:
    """(seconds, chunks) of the pipelined double-binary-tree all-reduce (module docstring)."""
    d = math.ceil(math.log2(n))
    busiest = nbytes if n == 2 else 2 * nbytes
    return min((2 * d * (a + nbytes / (2 * k * w)) + (k - 1) * (a + busiest / (k * w)), k)
               for k in range(1, MAX_CHUNKS + 1))


def all_reduce_seconds(nbytes: float, ranks: int, link: Interconnect) -> float:
    n, b, w, a = ranks, float(nbytes), link.bandwidth, link.latency
    if n <= 1 or b <= 0:
        return 0.0
    if link.topology == "ring":
        return 2 * (n - 1) / n * b / w + 2 * (n - 1) * a
    if link.topology == "tree":
        return tree_all_reduce_seconds(b, n, w, a)[0]
    return 2 * (n - 1) / n * b / w + 2 * a


def reduce_scatter_seconds(nbytes: float, ranks: int, link: Interconnect) -> float:
    """Ring reduce-scatter of a B-byte buffer (each rank ends with B/n of the sum); all-gather costs the same."""
    n = ranks
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) / n * float(nbytes) / link.bandwidth + (n - 1) * link.latency


all_gather_seconds = reduce_scatter_seconds


@dataclass
class Level:
    size: int                      # ranks (innermost) or groups of the level below
    link: Interconnect


@dataclass
class Cluster:
    """Ranks on a hierarchy of links, innermost first; a flat cluster has one level."""
    levels: list[Level]

    @classmethod
    def of(cls, ranks: int, levels: list[Level]) -> "Cluster":
        if len(levels) == 1:
            return cls([Level(ranks, levels[0].link)])
        inner = levels[0].size
        if inner < 1 or ranks % inner:
            raise UsageError(f"--ranks {ranks} is not a whole number of nodes of {inner} ranks (--ranks-per-node)")
        return cls([Level(inner, levels[0].link), Level(ranks // inner, levels[1].link)])

    @property
    def ranks(self) -> int:
        return math.prod(level.size for level in self.levels)

    def _split(self):
        (g, intra), (nodes, inter) = (self.levels[0].size, self.levels[0].link), \
            (self.levels[1].size, self.levels[1].link)
        return g, intra, nodes, inter.shared_by(g)

    def all_reduce(self, nbytes: float) -> float:
        if len(self.levels) == 1:
            return all_reduce_seconds(nbytes, self.levels[0].size, self.levels[0].link)
        g, intra, nodes, inter = self._split()
        return (reduce_scatter_seconds(nbytes, g, intra) + all_reduce_seconds(nbytes / g, nodes, inter)
                + all_gather_seconds(nbytes, g, intra))

    def reduce_scatter(self, nbytes: float) -> float:
        if len(self.levels) == 1:
            return reduce_scatter_seconds(nbytes, self.levels[0].size, self.levels[0].link)
        g, intra, nodes, inter = self._split()
        return reduce_scatter_seconds(nbytes, g, intra) + reduce_scatter_seconds(nbytes / g, nodes, inter)

    all_gather = reduce_scatter

    def sub(self, ranks: int) -> "Cluster":
        """The group of `ranks` consecutive ranks (a tensor- or pipeline-parallel group): inside a node when
        it fits there, else whole nodes."""
        if ranks <= self.levels[0].size:
            return Cluster([Level(ranks, self.levels[0].link)])
        return Cluster.of(ranks, self.levels)

    def strided(self, ranks: int, stride: int) -> "Cluster":
        """The group of `ranks` ranks `stride` apart (the data-parallel peers of a tp/pp layout)."""
        if len(self.levels) == 1 or ranks <= 1:
            return Cluster([Level(ranks, self.levels[0].link)])
        g = self.levels[0].size
        inside = max(1, g // stride) if stride < g else 1
        if inside >= ranks:
            return Cluster([Level(ranks, self.levels[0].link)])
        if inside == 1:
            return Cluster([Level(ranks, self.levels[1].link)])
        return Cluster([Level(inside, self.levels[0].link), Level(ranks // inside, self.levels[1].link)])

    def describe(self) -> list[dict]:
        names = ["intra-node", "inter-node"] if len(self.levels) == 2 else ["all ranks"]
        return [{"level": name, "ranks": lv.size, "bandwidth": lv.link.bandwidth, "latency": lv.link.latency,
                 "topology": lv.link.topology, "source": lv.link.source} for name, lv in zip(names, self.levels)]
