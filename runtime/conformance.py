"""Conformance: run every op a backend claims against PyTorch's own CPU implementation in float64.

For each op, `samples.SAMPLES` gives the ATen overload and a list of cases. A case becomes a
one-op opscope Graph (plus a `transpose` node in front of each non-contiguous input), built the
way capture builds nodes, and is compiled on the backend with `allow_fallback=False` -- so what
runs is the backend's own kernel from its registry, bound by its `prepare`. The reference is the
same ATen overload called on float64 copies of the inputs on the CPU.

    from opscope.runtime.conformance import check
    report = check(resolve("numpy"))           # Report: .cells (op x dtype), .failed
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

from .dtypes import FLOATS, name_of, to_torch
from .errors import UnsupportedOpError, UsageError, first_line
from .executor import Executor, compile_plan
from .graph import Graph, Node, Ref, TensorMeta
from .ops import OPS, op_for_target
from .samples import NC, SAMPLES, B, C, F, I, Z

aten = torch.ops.aten
# dtype -> (atol, rtol) against the float64 reference: |actual - ref| <= atol + rtol * |ref|
TOLERANCE = {"float64": (1e-9, 1e-7), "float32": (1e-5, 1e-4), "float16": (1e-2, 1e-2),
             "complex128": (1e-9, 1e-7), "complex64": (1e-5, 1e-4),
             "bfloat16": (5e-2, 5e-2)}
DEFAULT_DTYPES = ("float32", "float16", "float64", "int64")


@dataclass
class Cell:
    """One op in one dtype: pass / fail / unsupported, with the worst error over its cases."""

    op: str
    dtype: str
    status: str = "unsupported"         # pass | fail | unsupported | untested
    cases: int = 0                      # cases that ran
    max_abs: float = 0.0
    max_rel: float = 0.0
    message: str = ""                   # the first failure, or why unsupported

    def as_dict(self) -> dict:
        return {"op": self.op, "dtype": self.dtype, "status": self.status, "cases": self.cases,
                "max_abs_err": self.max_abs, "max_rel_err": self.max_rel, "message": self.message}


@dataclass
class Report:
    backend: str
    cells: list[Cell] = field(default_factory=list)

    @property
    def failed(self) -> list[Cell]:
        return [c for c in self.cells if c.status == "fail"]

    def counts(self) -> dict:
        out = {"pass": 0, "fail": 0, "unsupported": 0, "untested": 0}
        for c in self.cells:
            out[c.status] += 1
        return out

    def as_dict(self) -> dict:
        return {"backend": self.backend, "summary": self.counts(), "ok": not self.failed,
                "results": [c.as_dict() for c in self.cells]}


def claimed_ops(backend) -> list[str]:
    """The ops a backend claims (its registry), minus the nodes opscope inserts itself (INTERNAL_OPS)."""
    from .ops.registry import INTERNAL_OPS
    return [op for op in backend.ops.ops() if op not in INTERNAL_OPS]


def plan_cells(backend, ops=None, dtypes=DEFAULT_DTYPES) -> list[tuple[str, str]]:
    """(op, dtype) pairs to check: each op in the dtypes its sample entry lists."""
    claimed = claimed_ops(backend)
    if ops:
        unknown = [o for o in ops if o not in OPS]
        if unknown:
            raise UsageError(f"unknown op(s) {', '.join(unknown)} in --ops; `opscope backend check` without --ops "
                             "checks every op")
        claimed = [o for o in ops]
    pairs = []
    for op in claimed:
        sample = SAMPLES.get(op)
        if sample is None:
            pairs.append((op, "-"))
            continue
        for dt in sample.dtypes:
            if dt in dtypes or sample.dtypes == ("float32",):
                pairs.append((op, dt))
    return pairs


def check(backend, ops=None, dtypes=DEFAULT_DTYPES, progress=None) -> Report:
    """Check `backend`; `progress(op, dtype)` is called before each cell (for a progress bar)."""
    report = Report(backend.name)
    with np.errstate(all="ignore"):   # edge cases overflow on purpose; the comparison judges the result
        for op, dt in plan_cells(backend, ops, dtypes):
            if progress:
                progress(op, dt)
            report.cells.append(check_cell(backend, op, dt))
    return report


def check_cell(backend, op: str, dtype: str) -> Cell:
    cell = Cell(op, dtype)
    sample = SAMPLES.get(op)
    if sample is None:
        cell.status, cell.message = "untested", "no sample inputs for this op (add an entry to runtime/samples.py)"
        return cell
    if op in backend.ops.unsupported or (backend.ops.supported is not None and op not in backend.ops.supported
                                         and op not in backend.ops._kernels):
        why = backend.ops.supports(_probe(op))
        cell.message = why if isinstance(why, str) else ""
        return cell
    unsupported = []
    for i, case in enumerate(sample.cases):
        try:
            outcome = run_case(backend, op, sample, case, dtype)
        except Exception as e:  # a kernel that raises is a failure of that kernel, reported in the table
            cell.status = "fail"
            cell.message = cell.message or f"case {i}: {type(e).__name__}: {first_line(e)[:200]}"
            continue
        if isinstance(outcome, str):
            unsupported.append(outcome)
            continue
        ok, max_abs, max_rel, why = outcome
        cell.cases += 1
        cell.max_abs, cell.max_rel = max(cell.max_abs, max_abs), max(cell.max_rel, max_rel)
        if not ok:
            cell.status = "fail"
            cell.message = cell.message or f"case {i}: {why}"
    if cell.status != "fail":
        cell.status = "pass" if cell.cases else "unsupported"
        if not cell.cases:
            cell.message = unsupported[0] if unsupported else ""
    return cell


def _probe(op):
    return Node(index=0, name=op, op=op, target=None, args=(), kwargs={}, inputs=[], outputs=[],
                input_meta=[], output_meta=[])


# --- one case -----------------------------------------------------------------------------
def run_case(backend, op, sample, case, dtype):
    """(ok, max_abs, max_rel, why), or a string saying why the backend does not run this case."""
    target, args, kwargs = _split(sample, case)
    # NOTE: crc32, not hash(): str hashes are salted per process, and a failure must repeat in the next run
    gen = torch.Generator().manual_seed(zlib.crc32(repr((op, dtype, repr(case))).encode()))
    tensors: list[tuple[torch.Tensor, bool]] = []   # (value, non-contiguous)

    def make(spec):
        if isinstance(spec, (F, I, B)):
            t = _tensor(spec, dtype, gen)
            tensors.append((t, isinstance(spec, NC)))
            return t
        if isinstance(spec, list):
            return [make(s) for s in spec]
        return spec

    real_args = [make(a) for a in args]
    real_kwargs = {k: make(v) for k, v in kwargs.items()}
    graph = _one_op_graph(target, real_args, real_kwargs, tensors)
    mapped = graph.nodes[-1].op
    if mapped != op:
        raise AssertionError(f"sample for {op} uses {target}, which opscope maps to {mapped}")
    why = backend.ops.supports(graph.nodes[-1])
    if why is not True:
        return why
    try:
        plan = compile_plan(graph, backend, allow_fallback=False)
    except UnsupportedOpError as e:
        return str(e)
    host_inputs = [(t.transpose(-1, -2).contiguous() if nc else t) for t, nc in tensors]
    actual = Executor(plan).run_host(*host_inputs)
    expected = _flat(target(*_to64(real_args), **_to64(real_kwargs)))
    if len(actual) != len(expected):
        return False, math.inf, math.inf, f"{len(actual)} outputs, want {len(expected)}"
    worst_abs = worst_rel = 0.0
    for a, e, m in zip(actual, expected, graph.nodes[-1].output_meta):
        if m is None:            # a Python number (a size, an item): exact
            same = np.array_equal(np.asarray(a, dtype=np.float64), e.to(torch.float64).numpy())
            if not same:
                return False, math.inf, math.inf, f"{a!r}, want {e.tolist()!r}"
            continue
        ok, max_abs, max_rel, why = _compare(np.asarray(a), e, m, sample.values)
        worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, max_rel)
        if not ok:
            return False, worst_abs, worst_rel, why
    return True, worst_abs, worst_rel, ""


def _split(sample, case):
    if isinstance(case, C):
        args, kwargs = case.args, case.kwargs
    else:
        args, kwargs = tuple(case), {}
    if args and isinstance(args[0], torch._ops.OpOverload):
        return args[0], args[1:], kwargs
    return sample.target, args, kwargs


def _tensor(spec, dtype, gen) -> torch.Tensor:
    shape = spec.shape
    if isinstance(spec, NC):
        shape = shape[:-2] + (shape[-1], shape[-2]) if len(shape) >= 2 else shape
    if isinstance(spec, Z):              # complex: single precision unless the dtype under test is float64
        parts = torch.rand(shape + (2,), generator=gen, dtype=torch.float64) * (spec.hi - spec.lo) + spec.lo
        t = torch.view_as_complex(parts).to(torch.complex128 if dtype == "float64" else torch.complex64)
    elif isinstance(spec, B):
        t = torch.rand(shape, generator=gen) > 0.4
    elif isinstance(spec, I):
        t = torch.randint(spec.lo, spec.hi, shape, generator=gen)
    elif dtype.startswith(("int", "uint")):
        t = torch.randint(int(math.floor(spec.lo)), max(int(math.ceil(spec.hi)), int(math.floor(spec.lo)) + 1), shape,
                          generator=gen).to(to_torch(dtype))
    elif getattr(spec, "distinct", False):
        # NOTE: k/16 for distinct small k: exact in float16 and bfloat16 too, so casting makes no ties
        n = math.prod(shape)
        t = ((torch.randperm(n, generator=gen, dtype=torch.float64) - n // 2) / 16).reshape(shape).to(to_torch(dtype))
    else:
        t = (torch.rand(shape, generator=gen, dtype=torch.float64) * (spec.hi - spec.lo) + spec.lo).to(to_torch(dtype))
    if isinstance(spec, NC) and t.ndim >= 2:
        t = t.transpose(-1, -2)            # same values, non-contiguous strides
    return t


def _to64(x):
    if isinstance(x, torch.Tensor):
        return x.to(torch.float64) if x.is_floating_point() else x
    if isinstance(x, list):
        return [_to64(v) for v in x]
    if isinstance(x, dict):
        return {k: _to64(v) for k, v in x.items()}
    return x


def _flat(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (int, float, bool, torch.SymInt)):    # sym_size, item: Python numbers
        return [torch.tensor(out, dtype=torch.float64 if isinstance(out, float) else None)]
    return [t for o in out for t in _flat(o)]


def _meta(t):
    return TensorMeta(tuple(int(s) for s in t.shape), name_of(t.dtype))


def _one_op_graph(target, args, kwargs, tensors) -> Graph:
    """Graph inputs -> [transpose for non-contiguous inputs] -> the op, built as capture builds nodes."""
    nodes: list[Node] = []
    slot_meta: dict[int, TensorMeta] = {}
    input_slots: list[int] = []
    slot_of: dict[int, int] = {}
    counter = [0]

    def new_slot(meta):
        s = counter[0]
        counter[0] += 1
        slot_meta[s] = meta
        return s

    for t, nc in tensors:
        if nc:
            s_in = new_slot(_meta(t.transpose(-1, -2)))
            input_slots.append(s_in)
            s = new_slot(_meta(t))
            nodes.append(Node(index=len(nodes), name=f"transpose_{len(nodes)}", op="transpose",
                              target=aten.transpose.int, args=(Ref(s_in), -1, -2), kwargs={}, inputs=[s_in],
                              outputs=[s], input_meta=[slot_meta[s_in]], output_meta=[slot_meta[s]],
                              attrs={"dim0": -1, "dim1": -2}))
        else:
            s = new_slot(_meta(t))
            input_slots.append(s)
        slot_of[id(t)] = s

    reads: list[int] = []

    def sub(a):
        if isinstance(a, torch.Tensor):
            reads.append(slot_of[id(a)])
            return Ref(slot_of[id(a)])
        if isinstance(a, list):
            return [sub(x) for x in a]
        return a

    node_args = tuple(sub(a) for a in args)
    node_kwargs = {k: sub(v) for k, v in kwargs.items()}
    # Output shapes and dtypes the way capture gets them: the op's own meta kernel.
    try:
        fake = target(*_on_meta(args), **_on_meta(kwargs))
        if not isinstance(fake, (torch.Tensor, list, tuple)):
            raise NotImplementedError      # a Python number from meta (sym_size, item): its value is wanted
    except (NotImplementedError, RuntimeError):   # data-dependent shapes (boolean-mask index, nonzero): run it
        fake = target(*args, **kwargs)
    multi = isinstance(fake, (list, tuple))
    metas = [_meta(v) if isinstance(v, torch.Tensor) else None for v in (fake if multi else [fake])]
    outs = [new_slot(m) for m in metas]
    attrs = {}
    for arg_schema, a in zip(target._schema.arguments, args):
        if not isinstance(a, torch.Tensor) and not (isinstance(a, list) and a and isinstance(a[0], torch.Tensor)):
            attrs[arg_schema.name] = name_of(a) if isinstance(a, torch.dtype) else a
    attrs.update({k: name_of(v) if isinstance(v, torch.dtype) else v for k, v in kwargs.items()
                  if not isinstance(v, torch.Tensor)})
    op = op_for_target(target) or f"aten:{target}"
    nodes.append(Node(index=len(nodes), name=op, op=op, target=target, args=node_args, kwargs=node_kwargs,
                      inputs=reads, outputs=outs, input_meta=[slot_meta[s] for s in reads], output_meta=metas,
                      attrs=attrs, multi_output=multi))
    return Graph(nodes=nodes, num_slots=counter[0], input_slots=input_slots, constant_slots={},
                 output_refs=[Ref(s) for s in outs], slot_meta=slot_meta, model_name=f"conformance:{op}")


def _on_meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, list):
        return [_on_meta(v) for v in x]
    if isinstance(x, dict):
        return {k: _on_meta(v) for k, v in x.items()}
    return x


def _compare(actual: np.ndarray, expected: torch.Tensor, meta: TensorMeta, values: bool):
    want_shape = tuple(expected.shape)
    if tuple(actual.shape) != want_shape:
        return False, math.inf, math.inf, f"shape {tuple(actual.shape)}, want {want_shape}"
    got = name_of(actual.dtype)
    if got != meta.dtype and not (meta.dtype == "bfloat16" and got == "float32"):
        return False, 0.0, 0.0, f"dtype {got}, want {meta.dtype}"
    if not values or actual.size == 0:
        return True, 0.0, 0.0, ""
    cplx = expected.is_complex()
    if cplx:
        e, a = expected.detach().resolve_conj().to(torch.complex128).numpy(), actual.astype(np.complex128)
    else:
        e = expected.detach().to(torch.float64).numpy() if expected.dtype != torch.bool else expected.numpy()
        a = actual.astype(np.float64) if actual.dtype != np.bool_ else actual
    if meta.dtype not in FLOATS and not cplx:
        bad = np.asarray(a != e)
        n = int(bad.sum())
        diff = float(np.max(np.abs(a.astype(np.float64) - e.astype(np.float64)))) if n else 0.0
        return n == 0, diff, diff, f"{n} of {a.size} values differ (exact match expected for {meta.dtype})"
    atol, rtol = TOLERANCE[meta.dtype]
    same_nan = np.isnan(a) == np.isnan(e)
    same_inf = np.where(np.isinf(e), a == e, True)
    finite = np.isfinite(e) & np.isfinite(a)
    d = np.where(finite, np.abs(a - e), 0.0)
    max_abs = float(d.max())
    max_rel = float((d / np.maximum(np.abs(e), 1e-12) * finite).max())
    ok = bool(same_nan.all() and same_inf.all() and (d <= atol + rtol * np.abs(np.where(finite, e, 0))).all())
    why = "" if ok else f"max abs err {max_abs:.2e}, max rel err {max_rel:.2e} over tolerance (atol {atol}, rtol {rtol})"
    if not (same_nan.all() and same_inf.all()):
        why = "NaN/Inf where the reference has none (or the other way round)"
    return ok, max_abs, max_rel, why

