"""What-if at scale: data-parallel step time at N ranks from measured op costs and a collective model.

    m = measure("demo:gpt", ["sim:npu-a1"], [1.0])            # per-op costs of one step, per backend
    p = predict(m, ranks=1024, link=Interconnect(1e11, 5e-6, "ring"))
    p["step_seconds"], p["communication_share"], p["scaling_efficiency"]

The model (also in every prediction's "assumptions"):
- weak scaling: every rank keeps its rows, so the global batch grows with the ranks;
- a rank's compute is the measured forward+backward+optimizer time of its share on its backend (sum of
  its ops' durations: the roofline clock for sim chips, their fallback ops at the modelled host
  time, host timers otherwise: runtime/step_clock.py, what `train` reports); a step waits for the
  slowest share (synchronous data parallel);
- one all-reduce of every gradient per step, not overlapped with compute (an upper bound: bucketed
  overlap hides up to the backward's length);
- all-reduce of B bytes over n ranks on links of bandwidth W and latency a:
    ring        2(n-1)/n * B/W + 2(n-1) * a
    tree        2 * ceil(log2 n) * (B/W + a)          (reduce then broadcast along a binary tree)
    all-to-all  2(n-1)/n * B/W + 2 * a                (reduce-scatter and all-gather, every peer at once)
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..errors import UsageError

TOPOLOGIES = ("ring", "tree", "all-to-all")
DEFAULT_LINK = {"bandwidth": 2.5e10, "latency": 5e-6, "topology": "ring"}     # a PCIe 4 x16 class link


@dataclass
class Interconnect:
    bandwidth: float
    latency: float
    topology: str = "ring"
    source: str = "default"

    def __post_init__(self):
        if not (self.bandwidth > 0 and math.isfinite(self.bandwidth)):
            raise UsageError(f"interconnect bandwidth must be a positive number of bytes/s (got {self.bandwidth})")
        if not (self.latency >= 0 and math.isfinite(self.latency)):
            raise UsageError(f"interconnect latency must be >= 0 seconds (got {self.latency})")
        if self.topology not in TOPOLOGIES:
            raise UsageError(f"interconnect topology {self.topology!r}: use one of {', '.join(TOPOLOGIES)}")

    @classmethod
    def of(cls, backend_list, **override) -> "Interconnect":
        """The first description's [interconnect], else the default link; flags override either."""
        base, source = dict(DEFAULT_LINK), "default (PCIe 4 x16 class: 25 GB/s, 5 us, ring)"
        for b in backend_list:
            table = getattr(getattr(b, "description", None), "interconnect", None)
            if table:
                base.update(table)
                source = f"[interconnect] of {b.name}"
                break
        given = {k: v for k, v in override.items() if v is not None}
        if given:
            source += " with " + ", ".join(f"{k}={v}" for k, v in given.items())
        base.update(given)
        return cls(float(base["bandwidth"]), float(base["latency"]), base.get("topology", "ring"), source)


def all_reduce_seconds(nbytes: int, ranks: int, link: Interconnect) -> float:
    """The collective cost model (module docstring)."""
    n, b, w, a = ranks, float(nbytes), link.bandwidth, link.latency
    if n <= 1:
        return 0.0
    if link.topology == "ring":
        return 2 * (n - 1) / n * b / w + 2 * (n - 1) * a
    if link.topology == "tree":
        return 2 * math.ceil(math.log2(n)) * (b / w + a)
    return 2 * (n - 1) / n * b / w + 2 * a


@dataclass
class Measured:
    model: str
    shares: list[dict]              # backend, rows, compute_seconds (one step of its share), ops
    gradient_bytes: int
    parameters: int

    @property
    def compute_seconds(self) -> float:
        return max(s["compute_seconds"] for s in self.shares)


def measure(model_spec: str, specs: list[str], ratios: list[float], *, repeats: int = 2) -> Measured:
    """Time one training step of each backend's share (single process; the best of `repeats`)."""
    from .. import backends, models
    from ..step_clock import StepClock, clock_name
    from ..train.joint import capture_joint
    from ..train.step import OptimizerSpec, build_train_graph
    from .balance import split_rows
    from .split import GradientStep, OptimizerStep

    model, inputs = models.load_train(model_spec)
    rows = split_rows(ratios, int(inputs[0].shape[0]))
    shares, grad_bytes, params, start = [], 0, 0, 0
    for spec, n in zip(specs, rows):
        local = tuple(x[start:start + n] for x in inputs)
        start += n
        train = build_train_graph(capture_joint(model, local, model_spec), OptimizerSpec("sgd"))
        g = train.graph
        grad_bytes = sum(g.slot_meta[s].nbytes for s in train.joint.grad_slots.values())
        params = sum(g.slot_meta[s].numel for s in train.joint.param_slots.values())
        backend = backends.resolve(spec)
        step, opt = GradientStep(train, backend), OptimizerStep(train, backend)
        best = math.inf
        for _ in range(max(1, repeats)):
            clock = StepClock()         # the step `train` reports for this share: a sim chip's is exact
            with step.executor.hooked(clock):
                _, grads = step.run(local)
            with opt.executor.hooked(clock):
                opt.run(grads)
            best = min(best, clock.ns)
        shares.append({"backend": spec, "rows": n, "compute_seconds": best / 1e9, "compute_ns": best,
                       "clock": clock_name(backend), "ops": len(g.nodes)})
    return Measured(model_spec, shares, grad_bytes, params)


ASSUMPTIONS = [
    "weak scaling: every rank keeps its rows; the global batch grows with the ranks",
    "compute per step = the slowest share's measured forward+backward+optimizer time (synchronous data parallel)",
    "one all-reduce of all gradients per step, not overlapped with compute (upper bound)",
    "ring 2(n-1)/n*B/W + 2(n-1)*a; tree 2*ceil(log2 n)*(B/W + a); all-to-all 2(n-1)/n*B/W + 2*a",
    "links are uncontended and every rank has one; no stragglers, no failures",
]


def predict(m: Measured, ranks: int, link: Interconnect) -> dict:
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise UsageError(f"--ranks must be a positive integer (got {ranks})")
    compute = m.compute_seconds
    comm = all_reduce_seconds(m.gradient_bytes, ranks, link)
    step = compute + comm
    rows = sum(s["rows"] for s in m.shares)
    return {"model": m.model, "ranks": ranks, "shares": m.shares, "gradient_bytes": m.gradient_bytes,
            "parameters": m.parameters, "interconnect": asdict(link), "compute_seconds": compute,
            "communication_seconds": comm, "step_seconds": step,
            "communication_share": comm / step if step > 0 else 0.0,
            "scaling_efficiency": compute / step if step > 0 else 1.0,
            "rows_per_second": ranks * rows / len(m.shares) / step if step > 0 else 0.0,
            "assumptions": ASSUMPTIONS}
