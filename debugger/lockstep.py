"""Lockstep comparison: every op also runs on a reference backend, twice.

    ref(reference inputs)  the whole graph on the reference, in step with the real run:
                           total error = actual vs this (what the user sees at the output)
    ref(actual inputs)     the same node on the real run's inputs, converted to the host:
                           local error = actual vs this (what this op adds on its own)

An op whose local error exceeds the tolerance introduced the error; one whose total error is
high but local error is low inherited it from its inputs. Errors are scaled by the reference
output's largest magnitude, so one tolerance serves activations of any size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from opscope.runtime import backends
from opscope.runtime.graph import Ref
from opscope.runtime.session import compare

from .stats import to_host

# default tolerance (scaled max abs error) by output dtype
TOLERANCE = {"float64": 1e-10, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


@dataclass
class OpDiff:
    max_abs: float
    max_rel: float
    cosine: float
    err: float                 # total, scaled
    local: float               # introduced by this op, scaled
    tolerance: float
    note: str = ""

    @property
    def exceeds(self) -> bool:
        return self.err > self.tolerance

    @property
    def introduced(self) -> bool:
        return self.local > self.tolerance

    def verdict(self) -> str:
        if self.note and math.isnan(self.err):
            return self.note
        if self.introduced:
            return "error introduced by this op"
        if self.exceeds:
            return "error inherited from its inputs (this op adds little)"
        return "within tolerance"

    def as_dict(self) -> dict:
        d = dict(vars(self))
        d["verdict"] = self.verdict()
        return d


def _scaled(actual: list, expected: list) -> tuple[dict, float]:
    c = compare(actual, expected)
    scale = max((float(np.max(np.abs(np.nan_to_num(np.asarray(e, dtype=np.float64))))) for e in expected
                 if isinstance(e, np.ndarray) and e.size), default=0.0)
    return c, (c["max_abs"] / scale if scale > 0 else c["max_abs"])


class Lockstep:
    """Keeps a reference environment; `compare(call)` is called from the executor's after_op."""

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

    def start(self) -> None:
        g = self.plan.graph
        self.env = [None] * g.num_slots
        for s, v in self._constants.items():
            self.env[s] = v
        for s, v in zip(g.input_slots, self.inputs):
            self.env[s] = self.ref.memory.to_device(v)

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
        return OpDiff(math.nan, math.nan, math.nan, math.nan, math.nan, tol, note)

    def after_op(self, call, actual_host: list) -> OpDiff | None:
        """Run the node on the reference; None for transfers (they move values, nothing to compare)."""
        node = call.node
        st = self.plan.steps[call.seq]
        try:
            if node.op == "transfer":
                for s_in, s_out in zip(node.inputs, node.outputs):
                    self.env[s_out] = self.env[s_in]
                return None
            tol = self.tolerance_for(node)
            kernel = self._kernel(node)
            if kernel is None:
                return self._uncompared(node, actual_host, tol, f"{self.reference} has no kernel for {node.op}")
            kwargs = {k: self._materialize(v) for k, v in node.kwargs.items()}
            same_args = [self._to_ref(t, v, call.backend) for t, v in zip(node.args, call.inputs)]
            try:
                local_out = kernel(*same_args, **kwargs)
                ref_out = kernel(*self._materialize(node.args), **kwargs)
            except Exception as e:
                return self._uncompared(node, actual_host, tol, f"reference failed: {type(e).__name__}: {e}"[:120])
            ref_outs = [to_host(o, self.ref) for o in self._store(node, ref_out)]
            local_outs = [to_host(o, self.ref) for o in (local_out if node.multi_output else [local_out])]
            pairs = [(a, r, lo) for a, r, lo in zip(actual_host, ref_outs, local_outs)
                     if isinstance(a, np.ndarray) and isinstance(r, np.ndarray)]
            if not pairs:
                return None
            total, err = _scaled([p[0] for p in pairs], [p[1] for p in pairs])
            _, local = _scaled([p[0] for p in pairs], [p[2] for p in pairs])
            return OpDiff(total["max_abs"], total["max_rel"], total["cosine"], err, local, tol, total.get("note", ""))
        finally:
            for s in st.free_after:
                self.env[s] = None
