"""A compiled region's values checked against ATen before the region is used: a stack that converts an op to
wrong values fails its compile instead of passing silently, and partitioning splits that op off to the fallback.

    program = compile(region)
    check_values("openvino", region, program, compile)   # raises StackFailed naming the first member that is off

OpenVINO's importer converted the functional `aten::copy` as its first input (the values it overwrites), so T5's
label shift and Wav2Vec2's SpecAugment trained to wrong values with no error anywhere. The region runs once on
seeded sample inputs, and ATen (each member's own op, not the torch form an exporter traced) runs the same
members; when an output is off, the region is compiled again with every member's output an output
(region_numerics.widened), and the first member off ATen is the culprit (its inputs agreed). Where that program
agrees everywhere (the fault sits in a fusion across members), the failure names no member and partitioning
bisects, each prefix checked the same way.

Values no sample can pin are not compared: what a random op draws (opscope's fallback draws it under the
seeded rule) and what `empty` leaves, and everything computed from them.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .compare import compare
from .dtypes import to_torch as torch_dtype
from .partition import StackFailed, aten_name
from .region_numerics import widened
from .regions import Region, to_torch
from .uninitialised import UNINITIALISED

# float outputs: off when max |stack - ATen| passes this share of max(1, max |ATen|) (f32: rounding through a
# whole training step's region stays near 1e-6; a wrong conversion is off by the values themselves)
TOLERANCE = 1e-3
# a stack computing in reduced precision (f16/bf16 hints, TF32 matmuls): only a gross error is caught
REDUCED_PRECISION_TOLERANCE = 0.1
# ops that read only the shape and dtype of their first input: an unpinned one there leaves the result pinned
_SHAPE_OF_FIRST = {"copy", "fill", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full"}


def check_values(stack: str, region: Region, program, compile_unchecked, *, tolerance: float = TOLERANCE) -> None:
    """Raise StackFailed when `program` (region compiled by `stack`) computes an output off ATen's values;
    compile_unchecked(region) compiles a region without this check (used to find the member)."""
    inputs, aten, undefined = _reference(region)
    if aten is None:                   # ATen itself refuses every sample (an index past a dim of 1 and a zero divisor)
        return
    unpinned = _unpinned(region)
    host = [x.numpy() for x in inputs]
    try:
        got = program(*host)
    except Exception as e:             # noqa: BLE001 - inputs ATen takes, of the region's shapes: the stack's failure
        raise StackFailed(stack, region, e) from e
    off = _off_slots(region, zip(region.outputs, got), aten, undefined, unpinned, tolerance)
    if off is None:
        return
    slot, err = off
    wide = widened(region)
    try:
        got = compile_unchecked(wide)(*host)
        found = _off_slots(region, zip(wide.outputs, got), aten, undefined, unpinned, tolerance)
    except Exception:                  # noqa: BLE001 - the stack may not take the widened form; bisection will
        found = None
    maker = {s: (i, m) for i, m in enumerate(region.members) for s in m.outputs}
    if found is not None:
        (_, node), err = maker[found[0]], found[1]
        why = f"wrong values: {node.name} ({node.op}) is {err:.3g} off ATen on sample inputs"
        raise StackFailed(stack, region, ValueError(why), why, node=node)
    why = f"wrong values: an output of {maker[slot][1].op} is {err:.3g} off ATen on sample inputs (no member off alone)"
    raise StackFailed(stack, region, ValueError(why), why)


def _off_slots(region: Region, got, aten: dict, undefined: dict, unpinned: set, tolerance: float):
    """(slot, error) of the first value off ATen's (in member order, so the first member whose inputs agreed),
    or None."""
    order = {s: k for k, m in enumerate(region.members) for s in m.outputs}
    for s, g in sorted(got, key=lambda sg: order.get(sg[0], -1)):
        if s in unpinned or s not in aten:
            continue
        if (err := _off(g, aten[s], undefined.get(s))) > tolerance:
            return s, err
    return None


def _reference(region: Region):
    """(sample inputs, ATen's value of every member output and input, elements no stack need agree on): integers
    drawn from {0, 1} (valid indices wherever a dim has 2), zeros where ATen refuses those; a None for the values
    where it refuses both."""
    g = torch.Generator().manual_seed(0)
    for draw in (True, False):
        inputs = tuple(_sample(region.slot_meta[s], g, draw) for s in region.inputs)
        try:
            hit: list = []
            values = _run(region, inputs, POISON[0], hit)
            if not hit:
                return inputs, values, {}
            # a cast left elements undefined: what differs when they hold other values depends on them
            runs = [_run(region, inputs, k, []) for k in POISON[1:]]
            return inputs, values, {s: np.logical_or.reduce([_differ(v, r[s]) for r in runs])
                                    for s, v in values.items()}
        except Exception:              # noqa: BLE001 - a sample ATen refuses checks nothing
            continue
    return inputs, None, {}


# the values an undefined cast's elements hold, one ATen run each (see _poisoned)
POISON = (lambda info: 0, lambda info: info.min, lambda info: info.max)


def _run(region: Region, inputs, poison, hit: list) -> dict:
    """slot -> ATen's value, for every member output (and the region's inputs)."""
    wide = widened(region)
    module = to_torch(wide, target=lambda n: _poisoned(n.target, poison, hit) if n.op == "to" else n.target)
    with torch.no_grad():
        values = dict(zip(wide.outputs, (v.detach().resolve_conj() for v in module(*inputs))))   # (ifft's is lazy)
    return values | dict(zip(region.inputs, inputs))


def _poisoned(target, poison, hit: list):
    """`target` (a cast), with the elements C leaves undefined set to poison(iinfo): a float cast to an integer
    where it is NaN, infinite or out of range (ATen gives INT64_MIN on x86, OpenVINO other values; T5's
    relative-position buckets cast log(0) and leave those elements out later)."""
    def cast(*args, **kwargs):
        y, x = target(*args, **kwargs), args[0]
        if isinstance(x, torch.Tensor) and x.is_floating_point() and not y.is_floating_point() \
                and y.dtype != torch.bool:
            info = torch.iinfo(y.dtype)
            bad = ~torch.isfinite(x) | (x < info.min) | (x > info.max)
            if bool(bad.any()):
                hit.append(True)
                y = torch.where(bad, torch.full_like(y, poison(info)), y)
        return y
    return cast


def _differ(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    a, b = (t.float() if t.dtype == torch.bfloat16 else t for t in (a, b))
    return ((a != b) & ~(a.isnan() & b.isnan()) if a.is_floating_point() else a != b).numpy()


def _sample(meta, g, draw: bool):
    dt = torch_dtype(meta.dtype)
    if dt.is_floating_point:
        return torch.randn(meta.shape, generator=g).to(dt)
    if not draw:
        return torch.zeros(meta.shape, dtype=dt)
    return torch.randint(0, 2, meta.shape, generator=g).to(dt)


def _off(got, want: torch.Tensor, undefined=None) -> float:
    """How far the stack's value is from ATen's: compare's max abs error over the value's scale
    (max(1, max |ATen|)); 1.0 for any integer or boolean that differs, inf for another shape or NaN/inf where
    ATen has none. Elements in `undefined` are not compared."""
    got = np.asarray(got)
    want = (want.float() if want.dtype == torch.bfloat16 else want).numpy()
    if got.shape != want.shape:
        return float("inf")
    if undefined is not None:
        got = np.where(undefined, want, got)
    if not np.issubdtype(want.dtype, np.floating):
        return float(not np.array_equal(got, want))
    if np.isnan(want).all() and np.isnan(got).all():
        return 0.0                      # (compare calls it "nothing to compare", NaN; here ATen's NaN is matched)
    err = compare([got], [want])["max_abs"]
    if not math.isfinite(err):
        return float("inf")
    finite = np.abs(want[np.isfinite(want)])
    return err / max(1.0, float(finite.max()) if finite.size else 1.0)


def _unpinned(region: Region) -> set[int]:
    """Slots whose value no sample pins: a random op's draw or an `empty`, and all computed from them."""
    out: set[int] = set()
    for m in region.members:
        read = m.inputs[1:] if m.op in _SHAPE_OF_FIRST else m.inputs
        # NOTE: by the ATen name: opscope's op may be another (empty_strided runs as `zeros`, every stack
        # need not agree with ATen's uninitialised memory -- the OpInfo corpus found it)
        if _draws(m) or aten_name(m) in UNINITIALISED or any(s in out for s in read):
            out.update(m.outputs)
    return out


def _draws(node) -> bool:
    """Whether the node draws random numbers: a seeded-nondeterministic op, unless its dropout probability is 0
    or it is told it is not training (attention with dropout_p=0, the usual case, is as exact as a matmul)."""
    if torch.Tag.nondeterministic_seeded not in getattr(node.target, "tags", ()):
        return False
    schema = node.target._schema
    bound = {a.name: v for a, v in zip(schema.arguments, node.args)} | dict(node.kwargs)
    bound |= {a.name: a.default_value for a in schema.arguments if a.name not in bound and a.has_default_value()}
    return not (bound.get("dropout_p", bound.get("p")) == 0 or bound.get("train") is False)
