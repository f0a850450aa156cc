"""A learned cost model: how long an op, a fused group of ops, or a whole region takes on a backend,
predicted from graph features before it is measured.

CHOICE: gradient-boosted regression trees on log(time), written here in numpy (about a hundred lines)
rather than a graph neural network. The training sets a run store holds are small (hundreds to a few
thousand (op, backend) rows) and the signal is mostly per op -- FLOPs, bytes, op kinds, the backend --
where boosted trees are known to predict as well as a GNN with far less data and no torch in the loop;
the neighbourhood a GNN would learn enters as features (what a fused group holds, the producers'
kinds). A region's time is the sum of its ops' predictions plus the backend's per-region launch cost,
learned from the region rows. `benchmarks/bench_costmodel.py` reports its accuracy on models left out
of training (Spearman rank correlation), which is the number the placement search relies on.

The model is saved as JSON (numbers and names only, never pickle) and read back bounded.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

# The op kinds the registry knows, listed once (runtime/ops/registry.py); a fused name "a+b+c" counts
# one of each of its parts' kinds.
_DTYPE_BYTES = {"float64": 8, "int64": 8, "complex64": 8, "float32": 4, "int32": 4, "float16": 2,
                "bfloat16": 2, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
VERSION = 2            # 2: the op's work, log(FLOPs + bytes), is the first feature and the linear part's size
MAX_TREES = 2000
MAX_NODES = 1 << 12
MAX_FILE = 32 << 20
# What a model file's numbers may be: the log-time parts (base, weights, leaves) stay far inside exp()'s range
# (log of a year in ns is 38), a launch cost under a day, a learning rate in (0, 1].
MAX_LOG = 100.0
MAX_OVERHEAD_NS = 86_400e9


def _number(v, lo: float, hi: float, what: str) -> float:
    """A finite number in lo..hi read from a model file, or ValueError naming it."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise ValueError(f"{what} = {str(v)[:40]}, expected a number {lo:g}..{hi:g}")
    return float(v)


def kinds() -> list[str]:
    from .ops import OPS
    return sorted({o.kind for o in OPS.values() if o.kind})


def _kind_of(name: str) -> str:
    from .ops import OPS
    op = OPS.get(name)
    return op.kind if op is not None and op.kind else "custom"


@dataclass
class OpRow:
    """What the model sees of one op (or fused group) on one backend; time_ns when measured."""
    op: str                      # an opscope op name, or "a+b+c" for a group a stack fused
    backend: str
    flops: float = 0.0
    bytes: float = 0.0
    out_numel: float = 0.0
    in_numel: float = 0.0
    dtype: str = "float32"
    previous: str = ""           # the op run just before it (its neighbourhood: often its producer)
    time_ns: float | None = None
    model: str = ""              # which model it came from (for leave-one-model-out checks)


def features(row: OpRow, kind_names: list[str], backends: list[str]) -> list[float]:
    parts = [p for p in row.op.split("+") if p]
    counts = dict.fromkeys(kind_names, 0.0)
    for p in parts:
        k = _kind_of(p)
        if k in counts:
            counts[k] += 1.0
    near = dict.fromkeys(kind_names, 0.0)
    for p in row.previous.split("+"):
        if p and _kind_of(p) in near:
            near[_kind_of(p)] = 1.0
    work = max(row.flops, 0.0) + max(row.bytes, 0.0)
    return [math.log1p(work), math.log1p(max(row.flops, 0.0)), math.log1p(max(row.bytes, 0.0)),
            math.log1p(max(row.out_numel, 0.0)), math.log1p(max(row.in_numel, 0.0)), float(len(parts)),
            float(_DTYPE_BYTES.get(row.dtype, 4)),
            *counts.values(), *near.values(), *(1.0 if row.backend == b else 0.0 for b in backends)]


SIZES = 7              # the features before the op-kind counts (features' first list)


# --- boosted trees -------------------------------------------------------------------------
def _fit_tree(bins: np.ndarray, cuts: list[np.ndarray], r: np.ndarray, depth: int, min_leaf: int) -> list:
    """One regression tree on residuals r, as a flat list of nodes: [feature, threshold, left, right] for a
    split, [-1, value, 0, 0] for a leaf. bins[i, f]: how many of feature f's quantile cuts lie below
    sample i's value, so every split of a node is scored at once from two bincounts per feature."""
    nodes: list = []

    def grow(idx: np.ndarray, level: int) -> int:
        me = len(nodes)
        ri = r[idx]
        nodes.append([-1, float(ri.mean()) if idx.size else 0.0, 0, 0])
        if level == depth or idx.size < 2 * min_leaf:
            return me
        total, n = ri.sum(), idx.size
        best = (1e-12, -1, 0)
        for f, fcuts in enumerate(cuts):
            if not fcuts.size:
                continue
            b = bins[idx, f]
            nl = np.cumsum(np.bincount(b, minlength=fcuts.size + 1))[:-1]      # x <= cuts[j]
            sl = np.cumsum(np.bincount(b, weights=ri, minlength=fcuts.size + 1))[:-1]
            ok = (nl >= min_leaf) & (n - nl >= min_leaf)
            if not ok.any():
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                gain = np.where(ok, sl * sl / nl + (total - sl) ** 2 / (n - nl) - total * total / n, -np.inf)
            j = int(gain.argmax())
            if gain[j] > best[0]:
                best = (float(gain[j]), f, j)
        _, f, j = best
        if f < 0:
            return me
        left = bins[idx, f] <= j
        lo, hi = grow(idx[left], level + 1), grow(idx[~left], level + 1)
        nodes[me] = [f, float(cuts[f][j]), lo, hi]
        return me

    grow(np.arange(bins.shape[0]), 0)
    return nodes


def _predict_tree(nodes: list, x: np.ndarray) -> np.ndarray:
    t = np.asarray(nodes, dtype=float)
    feat, thr, lo, hi = t[:, 0].astype(int), t[:, 1], t[:, 2].astype(int), t[:, 3].astype(int)
    k = np.zeros(x.shape[0], dtype=int)
    for _ in range(len(nodes)):            # at most as many steps as nodes; a tree of depth d needs d
        f = feat[k]
        inner = f >= 0
        if not inner.any():
            break
        rows = np.nonzero(inner)[0]
        go_left = x[rows, f[rows]] <= thr[k[rows]]
        k[rows] = np.where(go_left, lo[k[rows]], hi[k[rows]])
    return thr[k]


@dataclass
class CostModel:
    kind_names: list[str]
    backends: list[str]
    base: float = 0.0                               # mean log(ns)
    linear: list = field(default_factory=list)      # log(ns) ~ sizes and backend, before the trees
    rate: float = 0.1
    trees: list = field(default_factory=list)
    region_overhead_ns: dict = field(default_factory=dict)   # per backend: a region's launch cost
    trained_on: list = field(default_factory=list)           # model names

    # --- training -------------------------------------------------------------------------
    @classmethod
    def fit(cls, rows: list[OpRow], regions: list[tuple[str, float, list[OpRow]]] = (), *, trees: int = 60,
            depth: int = 3, rate: float = 0.1, min_leaf: int = 5) -> "CostModel":
        """rows: measured ops; regions: (backend, measured region ns, its op rows) for the launch cost."""
        rows = [r for r in rows if r.time_ns and r.time_ns > 0]
        if not rows:
            raise ValueError("no measured op times to learn from")
        m = cls(kinds(), sorted({r.backend for r in rows}), rate=rate,
                trained_on=sorted({r.model for r in rows if r.model}))
        x = m._matrix(rows)
        y = np.log(np.array([r.time_ns for r in rows], dtype=float))
        m.base = float(y.mean())
        # NOTE: trees alone cannot extrapolate past the sizes they saw (a held-out model's biggest matmul
        # would cost what the training set's biggest did); a ridge fit of log(time) on log sizes and the
        # backend carries the scaling, and the trees learn what it misses.
        lin = m._linear_part(x)
        m.linear = np.linalg.solve(lin.T @ lin + np.eye(lin.shape[1]), lin.T @ (y - m.base)).tolist()
        pred = m.base + lin @ np.array(m.linear)
        cuts = [np.unique(np.quantile(x[:, f], np.linspace(0.04, 0.96, 25))) for f in range(x.shape[1])]
        bins = np.stack([np.searchsorted(c, x[:, f], side="left") for f, c in enumerate(cuts)], axis=1)
        for _ in range(trees):
            tree = _fit_tree(bins, cuts, y - pred, depth, min_leaf)
            pred += rate * _predict_tree(tree, x)
            m.trees.append(tree)
        # a region's launch cost: the least gap between a region's measured time and its ops' predicted sum.
        # NOTE: the least, not the median: a gap also holds what the stack's per-op attribution missed (a
        # model that calls its region in a loop, a stack that reports part of its work), which scales with
        # the model; a median of two or three regions carried demo:gpt's 160 ms to every small region.
        for backend in {b for b, _, _ in regions}:
            gaps = [t - float(m.predict(ops).sum()) for b, t, ops in regions if b == backend and ops]
            if gaps:
                m.region_overhead_ns[backend] = max(0.0, min(gaps))
        return m

    def _linear_part(self, x: np.ndarray) -> np.ndarray:
        """log(FLOPs + bytes) and the backend's one-hot (the last columns of the features). NOTE: one size,
        the op's work, not FLOPs and bytes apart: they are collinear on the ops a few models hold, and with
        both (and the element counts) the least-squares weights came out of opposite signs and ranked
        unseen models worse (held-out demo:gpt 0.65 with log FLOPs and log bytes, 0.74 with the work)."""
        return np.concatenate([x[:, :1], x[:, x.shape[1] - len(self.backends):]], axis=1)

    def _matrix(self, rows: list[OpRow]) -> np.ndarray:
        return np.array([features(r, self.kind_names, self.backends) for r in rows], dtype=float).reshape(
            len(rows), -1)

    # --- prediction -----------------------------------------------------------------------
    def predict(self, rows: list[OpRow]) -> np.ndarray:
        """Predicted ns per row."""
        if not rows:
            return np.zeros(0)
        x = self._matrix(rows)
        out = self.base + self._linear_part(x) @ np.array(self.linear) if self.linear else np.full(x.shape[0],
                                                                                                     self.base)
        for tree in self.trees:
            out += self.rate * _predict_tree(tree, x)
        return np.exp(out)

    def predict_region(self, backend: str, ops: list[OpRow]) -> float | None:
        """A region's predicted ns on a backend: its ops plus the backend's launch cost; None for a backend
        the model never saw (the caller measures instead)."""
        if backend not in self.backends:
            return None
        rows = [OpRow(**{**r.__dict__, "backend": backend}) for r in ops]
        return float(self.predict(rows).sum()) + self.region_overhead_ns.get(backend, 0.0)

    # --- files ----------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({"format": "opscope-cost-model", "version": VERSION, "kind_names": self.kind_names,
                           "backends": self.backends, "base": self.base, "linear": self.linear, "rate": self.rate,
                           "trees": self.trees,
                           "region_overhead_ns": self.region_overhead_ns, "trained_on": self.trained_on})

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "cost model") -> "CostModel":
        from .errors import UsageError
        from .safe_read import parse_json
        d = parse_json(text, where, "an opscope cost model")
        if not isinstance(d, dict) or d.get("format") != "opscope-cost-model":
            raise UsageError(f"{where}: not an opscope cost model; make one with `opscope costmodel fit`")
        if d.get("version") != VERSION:        # features laid out otherwise: its trees would read the wrong ones
            raise UsageError(f"{where}: a cost model of format version {str(d.get('version'))[:20]}, this opscope "
                             f"reads {VERSION}; make a new one with `opscope costmodel fit`")
        try:
            m = cls(kind_names=[str(k) for k in d["kind_names"]], backends=[str(b) for b in d["backends"]],
                    base=_number(d["base"], -MAX_LOG, MAX_LOG, "base"),
                    rate=_number(d["rate"], 1e-6, 1.0, "rate"),
                    region_overhead_ns={str(k): _number(v, 0.0, MAX_OVERHEAD_NS, "region_overhead_ns")
                                        for k, v in d["region_overhead_ns"].items()},
                    trained_on=[str(t) for t in d.get("trained_on", [])])
            width = SIZES + 2 * len(m.kind_names) + len(m.backends)
            m.linear = [_number(w, -MAX_LOG, MAX_LOG, "a linear weight") for w in d.get("linear", [])]
            if len(m.linear) not in (0, 1 + len(m.backends)):
                raise ValueError("linear part")
            trees = d["trees"]
            if not isinstance(trees, list) or len(trees) > MAX_TREES:
                raise ValueError("trees")
            for t in trees:
                if not isinstance(t, list) or not 0 < len(t) <= MAX_NODES:
                    raise ValueError("tree size")
                nodes = []
                for n in t:
                    f = int(n[0])
                    bound = 1e12 if f >= 0 else MAX_LOG   # a split's threshold: a feature; a leaf: a log-time step
                    nodes.append([f, _number(n[1], -bound, bound, "a node's value"), int(n[2]), int(n[3])])
                for i, (f, _, lo, hi) in enumerate(nodes):   # children after their parent: no loop, no escape
                    if not -1 <= f < width or (f >= 0 and not (i < lo < len(nodes) and i < hi < len(nodes))):
                        raise ValueError("node")
                m.trees.append(nodes)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as e:
            raise UsageError(f"{where}: a damaged cost model ({e}); make a new one with `opscope costmodel fit`")
        return m

    def save(self, path) -> None:
        from pathlib import Path
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(p)

    @classmethod
    def load(cls, path) -> "CostModel":
        from .safe_read import read_bounded
        return cls.from_json(read_bounded(path, MAX_FILE, str(path), "an opscope cost model"), str(path))


def default_path():
    from .home import opscope_home
    return opscope_home() / "cost_model.json"


def spearman(a, b) -> float:
    """Rank correlation (scipy's: average ranks for ties); nan for fewer than three pairs or a constant side."""
    import warnings

    from scipy.stats import spearmanr
    if len(a) < 3:
        return float("nan")
    with warnings.catch_warnings():          # a constant side is nan, which the callers print as n/a
        warnings.simplefilter("ignore")
        return float(spearmanr(a, b)[0])


# --- the placement search's hook (runtime/autoplace/predict.py) ------------------------------
_loaded: dict = {}


def node_rows(nodes, backend: str) -> list[OpRow]:
    """A graph's nodes as the rows the model reads, each with the op run before it as its neighbour."""
    from .ops import bytes_of, flops_of
    rows, previous = [], ""
    for n in nodes:
        outs = [m for m in n.output_meta if m is not None]
        rows.append(OpRow(n.op, backend, float(flops_of(n)), float(bytes_of(n)),
                          float(sum(math.prod(m.shape) for m in outs)),
                          float(sum(math.prod(m.shape) for m in n.input_meta if m is not None)),
                          str(outs[0].dtype) if outs else "float32", previous))
        previous = n.op
    return rows


def predict(stack: str, regions: list) -> float | None:
    """Seconds for one call of each region on `stack`, summed, from the model `opscope costmodel fit` saved
    ($OPSCOPE_HOME/cost_model.json); None where there is no model or it never saw the stack."""
    path = default_path()
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return None
    if _loaded.get("stamp") != (str(path), stamp):
        _loaded.update(stamp=(str(path), stamp), model=CostModel.load(path))
    model: CostModel = _loaded["model"]
    total = 0.0
    for region in regions:
        ns = model.predict_region(stack, node_rows(region.members, stack))
        if ns is None:
            return None
        total += ns
    return total / 1e9
