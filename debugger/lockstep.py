"""Lockstep comparison: every op also runs on a reference backend.

    ref(reference inputs)  the whole graph on the reference, in step with the real run:
                           total error = actual vs this (what the user sees at the output)
    ref(actual inputs)     the same node on the real run's inputs, converted to the host:
                           local error = actual vs this (what this op adds on its own)

An op whose local error exceeds the tolerance introduced the error; one whose total error is
high but local error is low inherited it from its inputs. Errors are scaled by the reference
output's largest magnitude, so one tolerance serves activations of any size.

    received = ref(actual inputs) vs ref(reference inputs): the error its inputs brought in

Error can also build up below tolerance and fail later (a float16 tanh whose rounding a later
`x - mean` magnifies): an op whose local error is more than rounding to its output dtype explains
(SIGNIFICANT_ULPS of its epsilon) is *significant* even under tolerance, so the report can name
where such error came from.

While the two runs agree exactly, the reference's inputs *are* the real run's inputs, so one
reference call serves both errors: the kernel runs twice only downstream of the first op whose
output differed (each slot remembers whether it still matches).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from opscope.runtime import backends
from opscope.runtime.graph import Ref

from .stats import fmt, to_host

# default tolerance (scaled max abs error) by output dtype
TOLERANCE = {"float64": 1e-10, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
_CHUNK = 1 << 16          # elements compared at a time: float64 buffers that stay in cache
# an op's own error above this many epsilons of its output dtype is more than rounding explains
# (float32 kernels of two libraries differ by a few ulps; a reduction by a few tens)
SIGNIFICANT_ULPS = 64


def significance(dtype: str, tolerance: float) -> float:
    """The local error above which an op introduced error of its own (never above the tolerance)."""
    try:
        eps = float(np.finfo(dtype).eps)
    except (TypeError, ValueError):     # bfloat16 (numpy has no finfo for it), integer and bool outputs
        eps = 2.0 ** -7 if dtype == "bfloat16" else 0.0
    return min(tolerance, SIGNIFICANT_ULPS * eps) if eps else tolerance


@dataclass
class Comparison:
    """actual vs expected over one or more arrays; max abs/rel over the values finite on both sides."""

    max_abs: float = 0.0
    max_rel: float = 0.0
    cosine: float = 1.0
    scale: float = 0.0          # largest finite |expected|
    both_bad: int = 0           # NaN (or the same Inf) on both sides
    mismatch: int = 0           # NaN/Inf on one side only, or Infs that differ
    numel: int = 0
    note: str = ""              # a shape that differs: nothing else is comparable
    within_1e3: int = 0         # finite values whose relative error is under 0.001 (msprobe's ratio)
    within_5e3: int = 0         # ... under 0.005
    finite: int = 0             # values finite on both sides (the ratios' denominator)

    def ratio(self, within: int) -> float:
        return within / self.finite if self.finite else math.nan

    @property
    def err(self) -> float:
        """Scaled max abs error; inf when the two sides disagree on NaN/Inf or shape."""
        if self.mismatch or self.note:
            return math.inf
        return self.max_abs / self.scale if self.scale > 0 else self.max_abs

    @property
    def exact(self) -> bool:
        return not self.note and not self.mismatch and self.max_abs == 0.0


def compare_arrays(actual: list, expected: list) -> Comparison:
    """Exact max abs / max rel, cosine, NaN/Inf agreement, chunk by chunk in float64.

    Vectorised per 64K-element chunk (numpy calls only, no per-element Python): a 16.8M-element
    float32 pair costs a few tens of ms and no full-size temporaries."""
    c = Comparison()
    dot = na = ne = 0.0
    buf = None
    for a, e in zip(actual, expected):
        a, e = np.asarray(a), np.asarray(e)
        if a.shape != e.shape:
            return Comparison(math.inf, math.inf, 0.0, note=f"shape {a.shape} != {e.shape}")
        if a.size == 0 or a.dtype.kind not in "fiub" or e.dtype.kind not in "fiub":
            continue
        fa, fe = a.reshape(-1), e.reshape(-1)
        n = fa.size
        c.numel += n
        if buf is None or buf[0].size < min(n, _CHUNK):
            buf = (np.empty(min(max(n, 1), _CHUNK)), np.empty(min(max(n, 1), _CHUNK)), np.empty(min(max(n, 1), _CHUNK)))
        for i in range(0, n, _CHUNK):
            k = min(_CHUNK, n - i)
            x, y, d = buf[0][:k], buf[1][:k], buf[2][:k]
            np.copyto(x, fa[i:i + k], casting="unsafe")
            np.copyto(y, fe[i:i + k], casting="unsafe")
            np.subtract(x, y, out=d)
            np.abs(d, out=d)
            m = float(d.max())
            if not math.isfinite(m):            # rare: NaN/Inf somewhere in this chunk
                x, y, d = _finite_part(c, x, y, d)
                if not d.size:
                    continue
                m = float(d.max())
            c.max_abs = max(c.max_abs, m)
            ay = np.abs(y)
            c.scale = max(c.scale, float(ay.max()))
            np.maximum(ay, 1e-6, out=ay)
            np.divide(d, ay, out=d)
            c.max_rel = max(c.max_rel, float(d.max()))
            c.finite += d.size
            c.within_1e3 += int(np.count_nonzero(d < 1e-3))
            c.within_5e3 += int(np.count_nonzero(d < 5e-3))
            # products by ufuncs, not np.dot: BLAS threads stall for ~1 s on a busy machine
            dot += _dot(x, y, d)
            na += _dot(x, x, d)
            ne += _dot(y, y, d)
    if na > 0 and ne > 0:
        c.cosine = dot / (math.sqrt(na) * math.sqrt(ne))
    elif na > 0 or ne > 0:
        c.cosine = 0.0              # one side all zeros, the other not
    return c


def _dot(x, y, tmp) -> float:
    np.multiply(x, y, out=tmp)
    return float(np.add.reduce(tmp))


def _finite_part(c: Comparison, x, y, d):
    """Count NaN/Inf agreement in a chunk and return its finite-on-both-sides part."""
    fx, fy = np.isfinite(x), np.isfinite(y)
    both = fx & fy
    bad = ~both
    same = bad & ((np.isnan(x) & np.isnan(y)) | (x == y))       # NaN and NaN, or +inf and +inf
    n_same = int(np.count_nonzero(same))
    c.both_bad += n_same
    c.mismatch += int(np.count_nonzero(bad)) - n_same
    return x[both], y[both], d[both]


@dataclass
class OpDiff:
    max_abs: float
    max_rel: float
    cosine: float
    err: float                 # total, scaled
    local: float               # introduced by this op, scaled
    tolerance: float
    note: str = ""
    nan_both: int = 0          # values NaN/Inf on both sides (against the reference run)
    nan_mismatch: int = 0      # values NaN/Inf on one side only
    nan_local: int = 0         # NaN/Inf on one side only against the reference on the same inputs
    received: float = 0.0      # error its inputs brought: ref(actual inputs) vs ref(reference inputs)
    significance: float = math.inf  # local error above this is more than rounding (under tolerance too)
    one_thousandth: float = math.nan    # fraction of values with relative error < 0.001 (msprobe)
    five_thousandths: float = math.nan  # ... < 0.005

    @property
    def compared(self) -> bool:
        return not (self.note and math.isnan(self.err))

    @property
    def exceeds(self) -> bool:
        return self.err > self.tolerance

    @property
    def introduced(self) -> bool:
        return self.local > self.tolerance

    @property
    def significant(self) -> bool:
        """This op added more error than rounding to its dtype explains (it may still be under tolerance)."""
        return self.local > self.significance

    @property
    def status(self) -> str:
        """pass | fail | nan (NaN/Inf on both sides, reported as such) | skip (not compared)."""
        if not self.compared:
            return "skip"
        if self.exceeds:
            return "fail"
        if self.nan_both:
            return "nan"
        return "pass"

    def verdict(self) -> str:
        if not self.compared:
            return self.note
        if self.nan_mismatch:
            where = "made here" if self.nan_local else "inherited"
            return (f"NaN/Inf on one side only ({self.nan_mismatch:,} values, {where}): "
                    + ("error introduced by this op" if self.introduced else "error inherited from its inputs"))
        if self.introduced:
            return "error introduced by this op"
        if self.exceeds:
            return "error inherited from its inputs (this op adds little)"
        if self.significant:
            return "within tolerance, but this op adds more error than rounding to its dtype explains"
        if self.nan_both:
            return (f"NaN/Inf on both sides ({self.nan_both:,} values): the reference makes them too; "
                    "the finite values agree")
        return "within tolerance"

    def summary(self) -> str:
        """One line of numbers (the verdict says what they mean)."""
        if not self.compared:
            return self.note
        return (f"max abs {fmt(self.max_abs)}  max rel {fmt(self.max_rel)}  cos {self.cosine:.6f}  "
                f"err {fmt(self.err)} (this op {fmt(self.local)}, from inputs {fmt(self.received)}, "
                f"tol {fmt(self.tolerance)})")

    def as_dict(self) -> dict:
        d = dict(vars(self))
        d["status"] = self.status
        d["introduced"] = self.introduced
        d["significant"] = self.significant
        d["verdict"] = self.verdict()
        return d


class Lockstep:
    """Keeps a reference environment; `after_op(call, host outputs)` is called from the executor's after_op.

    `inputs` None: the graph's inputs are taken from the real run as its ops read them."""

    def __init__(self, plan, inputs, reference: str = "numpy", tolerance: float | None = None):
        self.plan = plan
        self.ref = backends.resolve(reference)
        self.reference = reference
        self.tolerance = tolerance
        self.inputs = inputs
        self._kernels: dict[int, object] = {}
        g = plan.graph
        # constants go to the reference once, like the executor does per plan
        self._constants = {s: self.ref.memory.to_device(v) for s, v in g.constant_slots.items() if v is not None}
        self.env: list = []
        self._same: set[int] = set()     # slots whose value is the same on both sides
        self._drifted: set[int] = set()  # carried constants that differ between the two sides
        self._graph_inputs = set(g.input_slots)
        self.kernel_calls = 0            # reference kernel calls this run (tests and the benchmark read it)
        self.members: list = []          # the last region's members: [(node, OpDiff)]
        self.members_note = ""           # why they are only the region's outputs (a stack that cannot say)

    def start(self) -> None:
        g = self.plan.graph
        self.env = [None] * g.num_slots
        for s, v in self._constants.items():
            self.env[s] = v
        for s, v in zip(g.input_slots, self.inputs or ()):
            self.env[s] = self.ref.memory.to_device(v)
        self._same = (set(self._constants) - self._drifted) | set(g.input_slots)
        self.kernel_calls = 0

    def finish(self) -> None:
        """After a whole run: a training plan's carried values (updated parameters, optimizer
        state) become the reference's constants for the next step, as the executor does."""
        for c, o in getattr(self.plan, "carry", {}).items():
            if c in self._constants and self.env[o] is not None:
                self._constants[c] = self.env[o]
                if o in self._same:
                    self._drifted.discard(c)
                else:              # the two sides' parameters differ from here on
                    self._drifted.add(c)

    def tolerance_for(self, node) -> float:
        if self.tolerance is not None:
            return self.tolerance
        dt = next((m.dtype for m in node.output_meta if m is not None), "float32")
        return TOLERANCE.get(dt, 1e-4)

    def _kernel(self, node):
        if node.index not in self._kernels:
            k = self.ref.ops.kernel_for(node)
            self._kernels[node.index] = self.ref.prepare(node, k) if k is not None else None
        return self._kernels[node.index]

    def _to_ref(self, template, value, backend):
        """Rebuild an argument along the node's Ref structure, converting tensors to the reference."""
        if isinstance(template, Ref):
            return self.ref.memory.to_device(backend.memory.to_host(value))
        if isinstance(template, (list, tuple)):
            return type(template)(self._to_ref(t, v, backend) for t, v in zip(template, value))
        return value

    def _take_inputs(self, template, value, backend) -> None:
        """Without the run's inputs (a torch.compile region: Python made them between regions), the
        reference starts from the real run's values of the graph inputs an op reads."""
        if isinstance(template, Ref):
            if self.env[template.slot] is None and template.slot in self._graph_inputs:
                self.env[template.slot] = self.ref.memory.to_device(backend.memory.to_host(value))
        elif isinstance(template, (list, tuple)):
            for t, v in zip(template, value):
                self._take_inputs(t, v, backend)

    def _materialize(self, a):
        if isinstance(a, Ref):
            return self.env[a.slot]
        if isinstance(a, (list, tuple)):
            return type(a)(self._materialize(x) for x in a)
        return a

    def _store(self, node, out) -> list:
        outs = list(out) if node.multi_output else [out]
        for s, v in zip(node.outputs, outs):
            self.env[s] = v
        return outs

    def _uncompared(self, node, actual_host: list, tol: float, note: str) -> OpDiff:
        """An op the reference cannot run: its actual outputs stand in for the reference's (later ops still compare)."""
        self._store(node, [self.ref.memory.to_device(a) for a in actual_host] if node.multi_output
                    else self.ref.memory.to_device(actual_host[0]))
        self._same.update(node.outputs)
        return OpDiff(math.nan, math.nan, math.nan, math.nan, math.nan, tol, note, received=math.nan)

    def after_op(self, call, actual_host: list) -> OpDiff | None:
        """Run the node on the reference; None for transfers (they move values, nothing to compare).
        A compiler stack's region is compared member by member (`members`: this region's (node, OpDiff))."""
        node = call.node
        st = self.plan.steps[call.seq]
        self.members = []
        try:
            if self.inputs is None:
                self._take_inputs(node.args, call.inputs, call.backend)
            if node.op == "transfer":
                for s_in, s_out in zip(node.inputs, node.outputs):
                    self.env[s_out] = self.env[s_in]
                    if s_in in self._same:
                        self._same.add(s_out)
                    else:
                        self._same.discard(s_out)
                return None
            if node.op == "region":
                return self._region(call, st.kernel, actual_host)
            return self._compare(node, call.inputs, call.backend, actual_host)[0]
        finally:
            for s in st.free_after:
                self.env[s] = None

    def _compare(self, node, actual_args, backend, actual_host: list):
        """(OpDiff or None, the reference's outputs on the actual inputs): the node on the reference run's
        inputs (total error) and on the actual ones (local error). An actual output given as None is not
        compared (a region member whose value the stack did not return)."""
        tol = self.tolerance_for(node)
        kernel = self._kernel(node)
        if kernel is None:
            return self._uncompared(node, actual_host, tol, f"{self.reference} has no kernel for {node.op}"), None
        kwargs = {k: self._materialize(v) for k, v in node.kwargs.items()}
        same = all(s in self._same for s in node.inputs)
        try:
            ref_out = kernel(*self._materialize(node.args), **kwargs)
            self.kernel_calls += 1
            local_out = ref_out
            if not same:            # the inputs differ: what would this op give on the real ones?
                local_out = kernel(*[self._to_ref(t, v, backend) for t, v in zip(node.args, actual_args)],
                                   **kwargs)
                self.kernel_calls += 1
        except Exception as e:
            return self._uncompared(node, actual_host, tol, f"reference failed: {type(e).__name__}: {e}"[:120]), None
        ref_outs = [to_host(o, self.ref) for o in self._store(node, ref_out)]
        local_outs = ref_outs if same else [to_host(o, self.ref) for o in (local_out if node.multi_output else [local_out])]
        pairs = [(a, r) for a, r in zip(actual_host, ref_outs) if isinstance(a, np.ndarray) and isinstance(r, np.ndarray)]
        if not pairs:
            if same and any(a is None for a in actual_host):   # not returned: the reference stands in, still equal
                self._same.update(node.outputs)
            else:
                self._same.difference_update(node.outputs)
            return None, local_outs
        total = compare_arrays([p[0] for p in pairs], [p[1] for p in pairs])
        received = 0.0
        if same:
            local = total
        else:
            lp = [(a, lo) for a, lo in zip(actual_host, local_outs)
                  if isinstance(a, np.ndarray) and isinstance(lo, np.ndarray)]
            local = compare_arrays([p[0] for p in lp], [p[1] for p in lp])
            # what the inputs' error alone does to this op's output (the reference on both sides)
            received = compare_arrays([p[1] for p in lp], [p[1] for p in pairs]).err
        if total.exact and len(pairs) == len(node.outputs):
            self._same.update(node.outputs)
        else:
            self._same.difference_update(node.outputs)
        dtype = next((m.dtype for m in node.output_meta if m is not None), "float32")
        return OpDiff(total.max_abs, total.max_rel, total.cosine, total.err, local.err, tol, total.note,
                      nan_both=total.both_bad, nan_mismatch=total.mismatch, nan_local=local.mismatch,
                      received=received, significance=significance(dtype, tol),
                      one_thousandth=total.ratio(total.within_1e3),
                      five_thousandths=total.ratio(total.within_5e3)), local_outs

    def _region(self, call, program, actual_host: list) -> OpDiff | None:
        """Every member of a compiler stack's region against the reference, as if each ran on its own: the
        member's value as the stack computed it (region_numerics.intermediates) against the reference run
        (total) and against the reference on the stack's own values of its inputs (local). A member whose
        value the stack cannot return is not compared; the reference on the actual values stands in for
        it, so the members after it still get their local error. The region's own diff: its outputs,
        with the most error any member introduced as its local error."""
        from opscope.runtime.region_numerics import intermediates
        node = call.node
        region = node.attrs["region"]
        actual = {s: to_host(v, call.backend) for s, v in zip(region.inputs, call.inputs)}
        read = _slots_read(region)
        actual.update({s: to_host(v, self.ref) for s, v in self._constants.items() if s in read})
        known = dict(zip(node.outputs, actual_host))
        self.members_note = ""
        try:
            known = {**intermediates(call.backend, program, call.inputs), **known}
        except Exception as e:       # a stack that cannot return its members: the region's outputs only
            from opscope.runtime.errors import first_line
            self.members_note = (f"{call.backend.name} could not return the values inside {node.name}: "
                                 f"{type(e).__name__}: {first_line(e)[:120]}")
        inside = {s for m in region.members for s in m.outputs} - set(node.outputs)
        for m in region.members:
            args = [_fill(t, actual) for t in m.args]
            diff, stand_in = self._compare(m, args, _HOST, [known.get(s) for s in m.outputs])
            for s, k in zip(m.outputs, stand_in or [None] * len(m.outputs)):
                actual[s] = known[s] if known.get(s) is not None else k
            if diff is not None:
                self.members.append((m, diff))
        for s in inside:             # the plan frees the region's outputs; its inner values go with it
            self.env[s] = None
            self._same.discard(s)
        if not self.members:
            return None
        outs = [(a, to_host(self.env[s], self.ref)) for s, a in zip(node.outputs, actual_host)]
        pairs = [(a, r) for a, r in outs if isinstance(a, np.ndarray) and isinstance(r, np.ndarray)]
        total = compare_arrays([p[0] for p in pairs], [p[1] for p in pairs])
        worst = max((d for _, d in self.members), key=lambda d: d.local if d.local == d.local else -1.0)
        tol = self.tolerance_for(node)
        return OpDiff(total.max_abs, total.max_rel, total.cosine, total.err, worst.local, tol, total.note,
                      nan_both=total.both_bad, nan_mismatch=total.mismatch, nan_local=worst.nan_local,
                      received=0.0, significance=min(d.significance for _, d in self.members),
                      one_thousandth=total.ratio(total.within_1e3), five_thousandths=total.ratio(total.within_5e3))


class _HostMemory:
    @staticmethod
    def to_host(v):
        return v


class _Host:
    """The 'backend' of a region member's actual inputs: host arrays already."""
    name = "host"
    memory = _HostMemory()


_HOST = _Host()


def _slots_read(region) -> set:
    return {s for m in region.members for s in m.inputs}


def _fill(template, env):
    """A member's argument with its Refs replaced by the actual values (host arrays)."""
    if isinstance(template, Ref):
        return env.get(template.slot)
    if isinstance(template, (list, tuple)):
        return type(template)(_fill(t, env) for t in template)
    return template
