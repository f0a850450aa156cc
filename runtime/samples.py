"""Sample inputs for conformance: one entry per op, as data.

Each entry is `Sample(target, cases, dtypes)`: the ATen overload the op is captured as, a list of
cases, and the dtypes the op is checked in. A case is a tuple of arguments (optionally starting with
another overload, e.g. `add.Scalar`), or `C(args..., **kwargs)`. Tensor arguments are placeholders
that `conformance` materializes in the dtype under test:

    F(4, 5)            float tensor (dtype under test), uniform in [-2, 2)
    F(4, 5, lo=0.1)    ... in [lo, hi): for log, sqrt and friends
    F(4, 5, distinct=True)  no two values equal, in every dtype (sort/topk indices are exact only without ties)
    NC(4, 5)           the same, but non-contiguous (a transposed view produced inside the graph)
    I(4, 5, hi=7)      int64 in [0, hi) (indices, or the values of an int dtype under test)
    B(4, 5)            bool mask
    Z(4, 5)            complex tensor (for the FFT's complex-to-real half)

The edge cases a kernel gets wrong live here: empty dims, broadcasting, negative axes and
non-contiguous inputs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

aten = torch.ops.aten
FLOAT = ("float32", "float16", "float64")
NUM = FLOAT + ("int64",)           # ops that are also defined on integers
INT = ("int64",)
F32_64 = ("float32", "float64")    # torch's CPU kernel has no float16 (or its float16 meta disagrees)
ANY = ("float32",)                 # dtype-independent ops (creation with explicit dtype, index ops)


@dataclass(frozen=True)
class F:
    """A float tensor in the dtype under test (an int tensor when the dtype is an int)."""
    shape: tuple
    lo: float = -2.0
    hi: float = 2.0
    distinct: bool = False

    def __init__(self, *shape, lo=-2.0, hi=2.0, distinct=False):
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)
        object.__setattr__(self, "distinct", distinct)


def D(*shape):
    """F(*shape, distinct=True)."""
    return F(*shape, distinct=True)


class NC(F):
    """Non-contiguous: built contiguous with its last two dims swapped, then transposed in the graph."""


class Z(F):
    """A complex tensor (complex64; complex128 when the dtype under test is float64)."""


@dataclass(frozen=True)
class I:
    """An int64 tensor (indices), always int64 whatever the dtype under test."""
    shape: tuple
    hi: int = 4
    lo: int = 0

    def __init__(self, *shape, hi=4, lo=0):
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "hi", hi)
        object.__setattr__(self, "lo", lo)


@dataclass(frozen=True)
class B:
    """A bool mask."""
    shape: tuple

    def __init__(self, *shape):
        object.__setattr__(self, "shape", shape)


@dataclass
class C:
    """A case with keyword arguments (and optionally its own overload first)."""
    args: tuple
    kwargs: dict

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


@dataclass
class Sample:
    target: object                      # default ATen overload
    cases: list
    dtypes: tuple = FLOAT
    values: bool = True                 # False: only shape and dtype are defined (empty, empty_like)
    notes: str = ""
    extra: dict = field(default_factory=dict)


def _unary(name, lo=-2.0, hi=2.0, dtypes=FLOAT):
    t = getattr(aten, name).default
    return Sample(t, [(F(4, 5, lo=lo, hi=hi),), (F(2, 0, 3, lo=lo, hi=hi),), (NC(3, 6, lo=lo, hi=hi),),
                      (F(7, lo=lo, hi=hi),)], dtypes)


def _binary(name, dtypes=NUM, scalar=2.0, lo=-2.0):
    packet = getattr(aten, name)
    cases = [(F(4, 5), F(4, 5, lo=lo)), (F(2, 1, 3), F(4, 3, lo=lo)), (F(0, 3), F(1, 3, lo=lo)),
             (NC(3, 4), F(1, 4, lo=lo))]
    if scalar is not None and hasattr(packet, "Scalar"):
        cases.append((packet.Scalar, F(3, 4), scalar))
    return Sample(packet.Tensor if hasattr(packet, "Tensor") else packet.default, cases, dtypes)


def _compare(name):
    packet = getattr(aten, name)
    return Sample(packet.Tensor, [(F(4, 5), F(4, 5)), (F(2, 1, 3), F(4, 3)), (NC(3, 4), F(3, 1)),
                                  (packet.Scalar, F(3, 4), 0.5)], NUM)


def _logical(name):
    return Sample(getattr(aten, name).default, [(B(4, 5), B(4, 5)), (B(2, 1, 3), B(4, 3)), (B(0, 2), B(0, 2))], ANY)


def _reduce(name, dtypes=FLOAT, lo=-2.0):
    packet = getattr(aten, name)
    return Sample(packet.dim_IntList if hasattr(packet, "dim_IntList") else packet.default,
                  [(F(4, 5, lo=lo), [1]), (F(2, 3, 4, lo=lo), [-1], True), (F(2, 3, 4, lo=lo), [0, 2]),
                   (NC(3, 4, lo=lo), [0]), (F(0, 3, lo=lo), [1])], dtypes)


def _minmax(name):
    packet = getattr(aten, name)
    return Sample(packet.dim, [(F(4, 5), 1), (F(2, 3, 4), -1, True), (NC(3, 4), 0),
                               (packet.default, F(4, 5)), (packet.other, F(4, 5), F(4, 5))], FLOAT)


def _like(name, values=True):
    return Sample(getattr(aten, name).default, [(F(3, 4),), C(F(2, 0, 3), dtype=torch.int64)], FLOAT, values=values)


SAMPLES: dict[str, Sample] = {
    # --- elementwise arithmetic ---------------------------------------------------------
    "add": Sample(aten.add.Tensor, _binary("add").cases + [C(F(3, 4), F(3, 4), alpha=2)], NUM),
    "sub": Sample(aten.sub.Tensor, _binary("sub").cases + [C(F(3, 4), F(3, 4), alpha=2)], NUM),
    "rsub": Sample(aten.rsub.Tensor, [(F(4, 5), F(4, 5)), (F(2, 1, 3), F(4, 3)), (aten.rsub.Scalar, F(3, 4), 2.0)], NUM),
    "mul": _binary("mul"),
    "div": Sample(aten.div.Tensor, _binary("div", FLOAT, lo=0.5).cases
                  + [C(aten.div.Tensor_mode, F(4, 5), F(4, 5, lo=0.5), rounding_mode="trunc")], FLOAT),
    "floor_divide": Sample(aten.floor_divide.default, [(F(4, 5, lo=1, hi=9), F(4, 5, lo=1, hi=3)),
                                                       (F(2, 1, 3, lo=1, hi=9), F(4, 3, lo=1, hi=3))], ("float64", "int64")),
    "remainder": Sample(aten.remainder.Tensor, [(F(4, 5, lo=1, hi=9), F(4, 5, lo=1, hi=3)),
                                                (aten.remainder.Scalar, F(3, 4, lo=1, hi=9), 2)], ("float64", "int64")),
    "pow": Sample(aten.pow.Tensor_Scalar, [(F(4, 5, lo=0.1), 2), (F(4, 5, lo=0.1), 0.5), (NC(3, 4, lo=0.1), 3),
                                           (aten.pow.Tensor_Tensor, F(4, 5, lo=0.5), F(4, 5, lo=0, hi=2))], FLOAT),
    "maximum": _binary("maximum", scalar=None),
    "minimum": _binary("minimum", scalar=None),
    # --- unary math ---------------------------------------------------------------------
    "neg": _unary("neg", dtypes=NUM),
    "abs": _unary("abs", dtypes=NUM),
    "exp": _unary("exp"),
    "log": _unary("log", lo=0.1),
    "sqrt": _unary("sqrt", lo=0.0),
    "rsqrt": _unary("rsqrt", lo=0.1),
    "sin": _unary("sin"),
    "cos": _unary("cos"),
    "reciprocal": _unary("reciprocal", lo=0.2),
    "erf": _unary("erf"),
    "floor": _unary("floor"),
    "ceil": _unary("ceil"),
    "round": _unary("round"),
    "sign": _unary("sign", dtypes=NUM),
    "logical_not": Sample(aten.logical_not.default, [(B(4, 5),), (F(3, 4),), (B(0, 2),)], ANY),
    "bitwise_not": Sample(aten.bitwise_not.default, [(B(4, 5),), (I(3, 4, hi=100),)], ANY),
    "isnan": _unary("isnan"),
    "clamp": Sample(aten.clamp.default, [(F(4, 5), -0.5, 0.5), (F(4, 5), None, 0.5), (NC(3, 4), -1.0),
                                         C(aten.clamp.Tensor, F(4, 5), F(4, 5), F(4, 5, lo=2, hi=3))], NUM),
    "clamp_min": Sample(aten.clamp_min.default, [(F(4, 5), 0.25), (NC(3, 4), -1)], FLOAT),
    "clamp_max": Sample(aten.clamp_max.default, [(F(4, 5), 0.25), (NC(3, 4), -1)], FLOAT),
    # --- activations --------------------------------------------------------------------
    "relu": _unary("relu", dtypes=NUM),
    "gelu": Sample(aten.gelu.default, [(F(4, 5),), C(F(4, 5), approximate="tanh"), (NC(3, 6),), (F(0, 3),)]),
    "silu": _unary("silu"),
    "sigmoid": _unary("sigmoid"),
    "tanh": _unary("tanh"),
    "hardtanh": Sample(aten.hardtanh.default, [(F(4, 5),), (NC(3, 4), -0.5, 0.5)]),
    "hardswish": _unary("hardswish", lo=-4, hi=4),
    "hardsigmoid": _unary("hardsigmoid", lo=-4, hi=4),
    "leaky_relu": Sample(aten.leaky_relu.default, [(F(4, 5),), (NC(3, 4), 0.2)]),
    "elu": Sample(aten.elu.default, [(F(4, 5),), (NC(3, 4), 0.5)]),
    "softplus": Sample(aten.softplus.default, [(F(4, 5),), (F(3, 4, lo=-30, hi=30), 2.0, 10.0)]),
    # --- comparison and selection -------------------------------------------------------
    "eq": _compare("eq"), "ne": _compare("ne"), "lt": _compare("lt"),
    "le": _compare("le"), "gt": _compare("gt"), "ge": _compare("ge"),
    "logical_and": _logical("logical_and"),
    "logical_or": _logical("logical_or"),
    "bitwise_and": Sample(aten.bitwise_and.Tensor, [(B(4, 5), B(4, 5)), (I(3, 4, hi=100), I(3, 4, hi=100))], ANY),
    "bitwise_or": Sample(aten.bitwise_or.Tensor, [(B(4, 5), B(4, 5)), (I(3, 4, hi=100), I(1, 4, hi=100))], ANY),
    "and": Sample(aten.__and__.Tensor, [(B(4, 5), B(4, 5)), (B(2, 1, 3), B(4, 3))], ANY),
    "or": Sample(aten.__or__.Tensor, [(B(4, 5), B(4, 5)), (B(2, 1, 3), B(4, 3))], ANY),
    "where": Sample(aten.where.self, [(B(4, 5), F(4, 5), F(4, 5)), (B(4, 1), F(1, 5), F(4, 5)),
                                      (B(0, 3), F(0, 3), F(0, 3)), (B(3, 4), NC(3, 4), F(3, 4))], NUM),
    "masked_fill": Sample(aten.masked_fill.Scalar, [(F(4, 5), B(4, 5), -1.0), (F(2, 3, 4), B(3, 1), 0.0),
                                                    (NC(3, 4), B(3, 4), 2.0)], NUM),
    # --- reductions ---------------------------------------------------------------------
    "sum": Sample(aten.sum.dim_IntList, _reduce("sum").cases + [(aten.sum.default, F(4, 5))], NUM),
    "mean": Sample(aten.mean.dim, [(F(4, 5), [1]), (F(2, 3, 4), [-1], True), (F(2, 3, 4), [0, 2]), (NC(3, 4), [0]),
                                   (aten.mean.default, F(4, 5))]),
    "prod": Sample(aten.prod.dim_int, [(F(4, 5, lo=0.5, hi=1.5), 1), (F(2, 3, 4, lo=0.5, hi=1.5), -1, True),
                                       (aten.prod.default, F(3, 4, lo=0.5, hi=1.5))], NUM),
    "amax": Sample(aten.amax.default, [(F(4, 5), [1]), (F(2, 3, 4), [-1], True), (F(2, 3, 4), [0, 2]),
                                       (NC(3, 4), [0])], NUM),
    "amin": Sample(aten.amin.default, [(F(4, 5), [1]), (F(2, 3, 4), [-1], True), (NC(3, 4), [0])], NUM),
    "max": _minmax("max"),
    "min": _minmax("min"),
    "argmax": Sample(aten.argmax.default, [(F(4, 5), 1), (F(2, 3, 4), -1, True), (NC(3, 4), 0), (F(4, 5),)]),
    "argmin": Sample(aten.argmin.default, [(F(4, 5), 1), (F(2, 3, 4), -1, True), (NC(3, 4), 0), (F(4, 5),)]),
    "var": Sample(aten.var.correction, [C(F(4, 5), [1]), C(F(2, 3, 4), [-1], correction=0, keepdim=True),
                                        C(NC(3, 4), [0]), (aten.var.dim, F(4, 5), [1], False)]),
    "std": Sample(aten.std.correction, [C(F(4, 5), [1]), C(F(2, 3, 4), [-1], correction=0, keepdim=True),
                                        (aten.std.dim, NC(3, 4), [0], True)]),
    "all": Sample(aten.all.dim, [(B(4, 5), 1), (B(2, 3, 4), -1, True), (aten.all.default, B(3, 4))], ANY),
    "any": Sample(aten.any.dim, [(B(4, 5), 1), (B(2, 3, 4), -1, True), (aten.any.default, B(3, 4))], ANY),
    "vector_norm": Sample(aten.linalg_vector_norm.default, [(F(4, 5),), (F(4, 5), 2, [1]), (F(2, 3, 4), 1, [-1], True),
                                                            (NC(3, 4), 2, [0])]),
    "cumsum": Sample(aten.cumsum.default, [(F(4, 5), 1), (F(2, 3, 4), -1), (NC(3, 4), 0), (F(0, 3), 1)], NUM),
    # --- linear algebra -----------------------------------------------------------------
    "linear": Sample(aten.linear.default, [(F(4, 8), F(6, 8), F(6)), (F(2, 3, 8), F(5, 8)), (NC(8, 4), F(6, 4)),
                                           (F(0, 8), F(6, 8), F(6))]),
    "matmul": Sample(aten.matmul.default, [(F(4, 8), F(8, 6)), (F(2, 3, 8), F(8, 5)), (F(2, 1, 3, 8), F(4, 8, 2)),
                                           (F(8,), F(8, 3)), (NC(4, 8), F(8, 3)), (aten.mm.default, F(5, 7), F(7, 3))]),
    "bmm": Sample(aten.bmm.default, [(F(2, 4, 8), F(2, 8, 3)), (F(0, 4, 8), F(0, 8, 3))]),
    "addmm": Sample(aten.addmm.default, [(F(6), F(4, 8), F(8, 6)), C(F(4, 6), F(4, 8), F(8, 6), beta=0.5, alpha=2.0)]),
    "baddbmm": Sample(aten.baddbmm.default, [(F(2, 4, 3), F(2, 4, 8), F(2, 8, 3)),
                                             C(F(1, 3), F(2, 4, 8), F(2, 8, 3), beta=0.5, alpha=2.0)]),
    # --- convolution and pooling --------------------------------------------------------
    "conv1d": Sample(aten.conv1d.default, [(F(2, 3, 10), F(4, 3, 3), F(4)), (F(2, 4, 9), F(4, 2, 3), None, [2], [1], [1], 2)]),
    "conv2d": Sample(aten.conv2d.default, [(F(2, 3, 8, 8), F(4, 3, 3, 3), F(4)),
                                           (F(1, 4, 9, 7), F(6, 2, 3, 3), None, [2, 1], [1, 1], [1, 1], 2),
                                           (F(1, 2, 8, 8), F(3, 2, 3, 3), F(3), [1, 1], [2, 2], [2, 2]),
                                           (aten.conv2d.padding, F(1, 2, 6, 6), F(3, 2, 4, 4), None, [1, 1], "same")]),
    "convolution": Sample(aten.convolution.default, [(F(2, 3, 8, 8), F(4, 3, 3, 3), F(4), [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
                                                     (F(2, 3, 10), F(4, 3, 3), None, [2], [0], [1], False, [0], 1)]),
    "max_pool2d": Sample(aten.max_pool2d.default, [(F(2, 3, 8, 8), [2, 2]), (F(1, 2, 9, 9), [3, 3], [2, 2], [1, 1]),
                                                   (F(1, 2, 7, 7), [3, 3], [2, 2], [0, 0], [1, 1], True)]),
    "avg_pool2d": Sample(aten.avg_pool2d.default, [(F(2, 3, 8, 8), [2, 2]), (F(1, 2, 9, 9), [3, 3], [2, 2], [1, 1]),
                                                   (F(1, 2, 9, 9), [3, 3], [2, 2], [1, 1], False, False),
                                                   (F(1, 2, 7, 7), [3, 3], [2, 2], [0, 0], True)]),
    "adaptive_avg_pool2d": Sample(aten.adaptive_avg_pool2d.default, [(F(2, 3, 8, 8), [1, 1]), (F(1, 2, 7, 9), [3, 4])]),
    "adaptive_avg_pool1d": Sample(aten.adaptive_avg_pool1d.default, [(F(2, 3, 8), [1]), (F(1, 2, 7), [3])]),
    # --- normalization ------------------------------------------------------------------
    "batch_norm": Sample(aten.batch_norm.default, [(F(2, 3, 4, 4), F(3), F(3), F(3), F(3, lo=0.5), False, 0.1, 1e-5, False),
                                                   (F(4, 3), None, None, F(3), F(3, lo=0.5), False, 0.1, 1e-3, False)]),
    "layer_norm": Sample(aten.layer_norm.default, [(F(4, 8), [8], F(8), F(8)), (F(2, 3, 4), [3, 4]),
                                                   (NC(4, 8), [8], F(8), F(8), 1e-3)]),
    "group_norm": Sample(aten.group_norm.default, [(F(2, 6, 4, 4), 3, F(6), F(6)), (F(2, 4, 5), 2)]),
    "rms_norm": Sample(aten.rms_norm.default, [(F(4, 8), [8], F(8)), (F(2, 3, 4), [3, 4], None, 1e-6)]),
    "softmax": Sample(aten.softmax.int, [(F(4, 5), 1), (F(2, 3, 4), -1), (NC(3, 4), 0), (F(0, 3), -1),
                                         (aten._softmax.default, F(4, 5), -1, False)]),
    "log_softmax": Sample(aten.log_softmax.int, [(F(4, 5), 1), (F(2, 3, 4), -1), (NC(3, 4), 0),
                                                 (aten._log_softmax.default, F(4, 5), -1, False)]),
    "scaled_dot_product_attention": Sample(aten.scaled_dot_product_attention.default, [
        (F(2, 2, 5, 8), F(2, 2, 5, 8), F(2, 2, 5, 8)),
        C(F(1, 2, 4, 8), F(1, 2, 6, 8), F(1, 2, 6, 8), is_causal=True),
        (F(1, 2, 4, 8), F(1, 2, 6, 8), F(1, 2, 6, 4), B(4, 6)),
        C(F(1, 2, 4, 8), F(1, 2, 4, 8), F(1, 2, 4, 8), F(1, 1, 4, 4), scale=0.5),
        C(F(1, 4, 3, 8), F(1, 2, 3, 8), F(1, 2, 3, 8), enable_gqa=True)]),
    "embedding": Sample(aten.embedding.default, [(F(10, 4), I(3, 5, hi=10)), (F(10, 4), I(7, hi=10), 0),
                                                 (F(10, 4), I(0, hi=10))]),
    "dropout": Sample(aten.dropout.default, [(F(4, 5), 0.5, False), (NC(3, 4), 0.1, False)]),
    # --- views ---------------------------------------------------------------------------
    "view": Sample(aten.view.default, [(F(4, 6), [2, 12]), (F(4, 6), [-1]), (F(2, 0, 3), [0, 6]),
                                       (aten.reshape.default, NC(4, 6), [24]), (aten._unsafe_view.default, F(4, 6), [3, 8])], NUM),
    "permute": Sample(aten.permute.default, [(F(2, 3, 4), [2, 0, 1]), (F(2, 3, 4), [-1, 0, 1]), (NC(3, 4), [1, 0])], NUM),
    "transpose": Sample(aten.transpose.int, [(F(2, 3, 4), 0, 2), (F(2, 3, 4), -1, -2), (F(0, 3), 0, 1)], NUM),
    "t": Sample(aten.t.default, [(F(3, 4),), (F(5,),), (NC(3, 4),)], NUM),
    "expand": Sample(aten.expand.default, [(F(3, 1), [3, 4]), (F(1, 4), [2, -1, 4]), (F(0, 1), [0, 3])], NUM),
    "slice": Sample(aten.slice.Tensor, [(F(6, 5), 0, 1, 4), (F(6, 5), -1, 0, 5, 2), (F(6, 5), 1, -3), (F(6, 5), 0, 2, 2),
                                        (NC(4, 6), 1, 1, 100)], NUM),
    "narrow": Sample(aten.narrow.default, [(F(6, 5), 0, 1, 3), (F(6, 5), -1, 2, 2)], NUM),
    "select": Sample(aten.select.int, [(F(4, 5), 0, 2), (F(4, 5), -1, -1), (NC(3, 4), 1, 0)], NUM),
    "unsqueeze": Sample(aten.unsqueeze.default, [(F(4, 5), 0), (F(4, 5), -1), (F(0, 5), 1)], NUM),
    "squeeze": Sample(aten.squeeze.dim, [(F(4, 1, 5), 1), (F(4, 1, 5), -2), (F(4, 5), 0),
                                         (aten.squeeze.default, F(1, 4, 1)), (aten.squeeze.dims, F(1, 4, 1), [0, -1])], NUM),
    "flatten": Sample(aten.flatten.using_ints, [(F(2, 3, 4),), (F(2, 3, 4), 1), (F(2, 3, 4, 5), 1, -2), (NC(3, 4),)], NUM),
    "unflatten": Sample(aten.unflatten.int, [(F(2, 12), 1, [3, 4]), (F(6, 5), -2, [2, -1])], NUM),
    "alias": Sample(aten.alias.default, [(F(3, 4),), (aten.detach.default, F(3, 4))], NUM),
    "contiguous": Sample(aten.clone.default, [(F(3, 4),), (NC(3, 4),), (aten.contiguous.default, NC(3, 4))], NUM),
    "unbind": Sample(aten.unbind.int, [(F(3, 4),), (F(3, 4), -1), (NC(3, 4), 1)], NUM),
    "split": Sample(aten.split.Tensor, [(F(7, 4), 3), (F(4, 6), 2, -1), (aten.split_with_sizes.default, F(6, 4), [1, 2, 3])], NUM),
    "chunk": Sample(aten.chunk.default, [(F(7, 4), 3), (F(4, 6), 2, -1)], NUM),
    # --- joining and indexing -----------------------------------------------------------
    "cat": Sample(aten.cat.default, [([F(2, 3), F(4, 3)],), ([F(2, 3), F(2, 5)], -1), ([F(2, 3), F(0, 3)],),
                                     ([NC(3, 4), F(3, 4)], 1)], NUM),
    "stack": Sample(aten.stack.default, [([F(2, 3), F(2, 3)],), ([F(2, 3), F(2, 3), F(2, 3)], -1)], NUM),
    "repeat": Sample(aten.repeat.default, [(F(2, 3), [2, 1]), (F(2, 3), [2, 1, 3])], NUM),
    "index": Sample(aten.index.Tensor, [(F(6, 5), [I(4, hi=6)]), (F(6, 5), [None, I(2, 3, hi=5)]),
                                        (F(6, 5), [B(6)]), (F(4, 5, 3), [I(2, hi=4), I(2, hi=5)])], NUM),
    "index_select": Sample(aten.index_select.default, [(F(6, 5), 0, I(4, hi=6)), (F(6, 5), -1, I(3, hi=5))], NUM),
    "gather": Sample(aten.gather.default, [(F(4, 5), 1, I(4, 3, hi=5)), (F(4, 5), 0, I(2, 5, hi=4))], NUM),
    "tril": Sample(aten.tril.default, [(F(4, 5),), (F(2, 4, 4), -1), (F(4, 5), 2)], NUM),
    "triu": Sample(aten.triu.default, [(F(4, 5),), (F(2, 4, 4), 1), (F(4, 5), -2)], NUM),
    "flip": Sample(aten.flip.default, [(F(4, 5), [0]), (F(2, 3, 4), [-1, 0])], NUM),
    "roll": Sample(aten.roll.default, [(F(4, 5), [1], [0]), (F(2, 3, 4), [2, -1], [-1, 0]), (F(4, 5), [3])], NUM),
    "diff": Sample(aten.diff.default, [(F(4, 5),), (F(4, 5), 1, 0), (F(4, 5), 2, -1)], NUM),
    "pad": Sample(aten.constant_pad_nd.default, [(F(2, 3), [1, 2]), (F(2, 3, 4), [1, 0, 2, 1], 1.5),
                                                 (aten.pad.default, F(1, 2, 5), [2, 1], "reflect"),
                                                 (aten.pad.default, F(1, 2, 5), [2, 1], "replicate")]),
    # --- creation (dtype comes from the case, so one column) -----------------------------
    "arange": Sample(aten.arange.default, [(5,), C(7, dtype=torch.float32), (aten.arange.start, 2, 9),
                                           (aten.arange.start_step, 0.0, 2.0, 0.25)], ANY),
    "full": Sample(aten.full.default, [([2, 3], 1.5), C([2, 3], 7, dtype=torch.int64), C([0, 3], True)], ANY),
    "zeros": Sample(aten.zeros.default, [([2, 3],), C([4], dtype=torch.int64)], ANY),
    "ones": Sample(aten.ones.default, [([2, 3],), C([4], dtype=torch.bool)], ANY),
    "full_like": Sample(aten.full_like.default, [(F(3, 4), 2.5), C(F(2, 3), 4, dtype=torch.int64)], FLOAT),
    "zeros_like": _like("zeros_like"),
    "ones_like": _like("ones_like"),
    "new_full": Sample(aten.new_full.default, [(F(3), [2, 3], 2.5)], FLOAT),
    "new_zeros": Sample(aten.new_zeros.default, [(F(3), [2, 3]), C(F(3), [4], dtype=torch.int64)], FLOAT),
    "new_ones": Sample(aten.new_ones.default, [(F(3), [2, 3])], FLOAT),
    "scalar_tensor": Sample(aten.scalar_tensor.default, [(2.5,), C(3, dtype=torch.int64)], ANY),
    # --- type conversion ----------------------------------------------------------------
    "to": Sample(aten.to.dtype, [(F(3, 4), torch.float64), (F(3, 4), torch.int64), (NC(3, 4), torch.float16),
                                 (aten._to_copy.default, F(3, 4)), C(aten._to_copy.default, F(3, 4), dtype=torch.float32),
                                 (aten.type_as.default, F(3, 4), I(2, hi=3))], NUM),
    # --- trig, log and friends ------------------------------------------------------------
    "tan": _unary("tan", lo=-1.2, hi=1.2), "asin": _unary("asin", lo=-0.99, hi=0.99),
    "acos": _unary("acos", lo=-0.99, hi=0.99), "atan": _unary("atan"), "sinh": _unary("sinh"),
    "cosh": _unary("cosh"), "asinh": _unary("asinh"), "acosh": _unary("acosh", lo=1.01, hi=4.0),
    "atanh": _unary("atanh", lo=-0.99, hi=0.99), "expm1": _unary("expm1"), "log1p": _unary("log1p", lo=-0.9),
    "log2": _unary("log2", lo=0.1), "log10": _unary("log10", lo=0.1), "trunc": _unary("trunc"),
    "isinf": Sample(aten.isinf.default, [(F(4, 5),), (F(0, 3),)]),
    "atan2": _binary("atan2", FLOAT, scalar=None),
    "fmod": Sample(aten.fmod.Tensor, [(F(4, 5, lo=-9, hi=9), F(4, 5, lo=1, hi=3)),
                                      (aten.fmod.Scalar, F(3, 4, lo=-9, hi=9), 2)], ("float64", "int64")),
    "bitwise_xor": Sample(aten.bitwise_xor.Tensor, [(B(4, 5), B(4, 5)), (I(3, 4, hi=100), I(1, 4, hi=100)),
                                                    (aten.bitwise_xor.Scalar, I(3, 4, hi=100), 5)], ANY),
    "logical_xor": _logical("logical_xor"),
    "histc": Sample(aten.histc.default, [(F(50),), (F(4, 5), 7, -1.0, 1.0), (F(30), 4, 0.0, 0.0)], F32_64),
    # --- convolution, pooling, upsampling -----------------------------------------------
    "conv3d": Sample(aten.conv3d.default, [(F(1, 2, 5, 5, 5), F(3, 2, 3, 3, 3), F(3)),
                                           (F(1, 4, 5, 6, 5), F(4, 2, 2, 3, 2), None, [2, 1, 1], [1, 0, 1], [1, 1, 1], 2)]),
    "conv_transpose1d": Sample(aten.conv_transpose1d.default, [(F(2, 3, 7), F(3, 4, 3), F(4)),
                                                               (F(1, 4, 6), F(4, 2, 3), None, [2], [1], [1], 2, [2])]),
    "conv_transpose2d": Sample(aten.conv_transpose2d.input, [(F(1, 3, 5, 5), F(3, 4, 3, 3), F(4), [2, 2]),
                                                             (F(2, 4, 4, 5), F(4, 3, 2, 3), None, [2, 1], [1, 0], [1, 0], 2,
                                                              [1, 2]), (F(3, 5, 5), F(3, 2, 3, 3))]),
    "conv_transpose3d": Sample(aten.conv_transpose3d.input, [(F(1, 2, 3, 4, 3), F(2, 3, 2, 2, 2), F(3), [2, 1, 2])]),
    "col2im": Sample(aten.col2im.default, [(F(1, 8, 9), [4, 4], [2, 2], [1, 1], [0, 0], [1, 1]),
                                           (F(2, 4, 9), [5, 5], [2, 2], [1, 1], [1, 1], [2, 2])]),
    "max_pool1d": Sample(aten.max_pool1d.default, [(F(2, 3, 9), [3]), (F(1, 2, 9), [3], [2], [1], [1], True)]),
    "max_pool3d": Sample(aten.max_pool3d.default, [(F(1, 2, 5, 5, 5), [2, 2, 2]), (F(1, 2, 6, 5, 5), [3, 3, 3], [2, 2, 2], [1, 1, 1])]),
    "max_pool1d_with_indices": Sample(aten.max_pool1d_with_indices.default, [(F(2, 3, 9), [3], [2], [1])]),
    "max_pool2d_with_indices": Sample(aten.max_pool2d_with_indices.default, [
        (F(2, 3, 8, 8), [2, 2]), (F(1, 2, 9, 9), [3, 3], [2, 2], [1, 1]), (F(1, 2, 7, 7), [3, 3], [2, 2], [0, 0], [2, 2], True)]),
    "max_pool3d_with_indices": Sample(aten.max_pool3d_with_indices.default, [(F(1, 2, 5, 5, 5), [2, 2, 2], [2, 2, 2], [1, 1, 1])]),
    "avg_pool1d": Sample(aten.avg_pool1d.default, [(F(2, 3, 9), [3]), (F(1, 2, 9), [3], [2], [1], False, False)]),
    "avg_pool3d": Sample(aten.avg_pool3d.default, [(F(1, 2, 5, 5, 5), [2, 2, 2]),
                                                   (F(1, 2, 6, 5, 5), [3, 3, 3], [2, 2, 2], [1, 1, 1], True, False)], F32_64),
    "adaptive_avg_pool3d": Sample(aten.adaptive_avg_pool3d.default, [(F(1, 2, 4, 6, 6), [2, 3, 3]), (F(1, 2, 5, 7, 3), [2, 3, 2]),
                                                                     (aten._adaptive_avg_pool3d.default, F(1, 2, 4, 4, 4), [2, 2, 2])]),
    "adaptive_max_pool1d": Sample(aten.adaptive_max_pool1d.default, [(F(2, 3, 8), [4]), (F(1, 2, 7), [3])]),
    "adaptive_max_pool2d": Sample(aten.adaptive_max_pool2d.default, [(F(2, 3, 8, 8), [1, 1]), (F(1, 2, 7, 9), [3, 4])]),
    "adaptive_max_pool3d": Sample(aten.adaptive_max_pool3d.default, [(F(1, 2, 5, 6, 4), [2, 3, 2])]),
    "upsample_nearest1d": Sample(aten.upsample_nearest1d.vec, [(F(1, 2, 5), [9], None), (F(1, 2, 5), None, [2.0])]),
    "upsample_nearest2d": Sample(aten.upsample_nearest2d.vec, [(F(1, 2, 4, 5), [8, 7], None), (F(1, 2, 3, 3), None, [2.0, 3.0]),
                                                               (aten.upsample_nearest2d.default, F(1, 2, 3, 4), [6, 8])]),
    "upsample_nearest3d": Sample(aten.upsample_nearest3d.vec, [(F(1, 2, 2, 3, 3), [4, 6, 5], None)]),
    "upsample_nearest_exact1d": Sample(aten._upsample_nearest_exact1d.vec, [(F(1, 2, 5), [9], None)]),
    "upsample_nearest_exact2d": Sample(aten._upsample_nearest_exact2d.vec, [(F(1, 2, 4, 5), [7, 8], None)]),
    "upsample_nearest_exact3d": Sample(aten._upsample_nearest_exact3d.vec, [(F(1, 2, 2, 3, 3), [3, 5, 4], None)]),
    "upsample_linear1d": Sample(aten.upsample_linear1d.vec, [(F(1, 2, 5), [9], False, None), (F(1, 2, 5), [9], True, None)]),
    "upsample_bilinear2d": Sample(aten.upsample_bilinear2d.vec, [
        (F(1, 2, 4, 5), [8, 7], False, None), (F(1, 2, 4, 5), [8, 7], True, None), (F(2, 3, 3, 3), None, False, [2.0, 2.0]),
        (aten.upsample_bilinear2d.default, F(1, 2, 3, 4), [6, 9], False)]),
    "upsample_trilinear3d": Sample(aten.upsample_trilinear3d.vec, [(F(1, 2, 2, 3, 3), [4, 5, 6], False, None)]),
    "grid_sampler_2d": Sample(aten.grid_sampler_2d.default, [(F(2, 3, 5, 6), F(2, 4, 3, 2, lo=-1.1, hi=1.1), 0, 0, False),
                                                             (F(1, 2, 5, 5), F(1, 3, 3, 2, lo=-1, hi=1), 0, 1, True),
                                                             (F(1, 2, 5, 5), F(1, 3, 3, 2, lo=-0.9, hi=0.9), 1, 0, False)]),
    "reflection_pad": Sample(aten.reflection_pad2d.default, [(F(1, 2, 4, 5), [1, 2, 2, 1]),
                                                             (aten.reflection_pad1d.default, F(2, 3, 6), [2, 3]),
                                                             (aten.reflection_pad3d.default, F(1, 1, 3, 3, 3), [1, 1, 1, 1, 1, 1])]),
    "replication_pad": Sample(aten.replication_pad2d.default, [(F(1, 2, 4, 5), [1, 2, 2, 1]),
                                                               (aten.replication_pad1d.default, F(2, 3, 6), [2, 3]),
                                                               (aten.replication_pad3d.default, F(1, 1, 3, 3, 3), [1, 0, 2, 1, 0, 1])]),
    # --- normalization and dropout variants ----------------------------------------------
    "native_group_norm": Sample(aten.native_group_norm.default, [(F(2, 6, 4, 4), F(6), F(6), 2, 6, 16, 3, 1e-5),
                                                                 (F(2, 4, 5), None, None, 2, 4, 5, 2, 1e-5)]),
    "native_batch_norm_legit": Sample(aten._native_batch_norm_legit.default, [
        (F(2, 3, 4, 4), F(3), F(3), F(3), F(3, lo=0.5), False, 0.1, 1e-5),
        (F(4, 3), None, None, F(3), F(3, lo=0.5), True, 0.1, 1e-3),
        (aten._native_batch_norm_legit.no_stats, F(2, 3, 5), F(3), F(3), True, 0.1, 1e-5)], F32_64),
    "native_batch_norm_no_training": Sample(aten._native_batch_norm_legit_no_training.default, [
        (F(2, 3, 4, 4), F(3), F(3), F(3), F(3, lo=0.5), 0.1, 1e-5)], F32_64),
    "weight_norm": Sample(aten._weight_norm.default, [(F(4, 3), F(4, 1)), (F(4, 3, 5), F(1, 1, 5), 2), (F(3, 4), F(1, 1), -1)]),
    "weight_norm_interface": Sample(aten._weight_norm_interface.default, [(F(4, 3), F(4, 1)), (F(4, 3, 5), F(1, 1, 5), 2)], F32_64),
    "feature_dropout": Sample(aten.feature_dropout.default, [(F(2, 3, 4, 4), 0.5, False), (F(2, 3, 4), 0.0, True)]),
    "alpha_dropout": Sample(aten.alpha_dropout.default, [(F(4, 5), 0.5, False), (F(4, 5), 0.0, True)]),
    "feature_alpha_dropout": Sample(aten.feature_alpha_dropout.default, [(F(2, 3, 4), 0.5, False)]),
    "embedding_bag": Sample(aten._embedding_bag.default, [
        (F(10, 3), I(8, hi=10), I(2, hi=1), False, 1),
        (F(10, 3), I(8, hi=10), I(1, hi=1), False, 2), C(F(10, 3), I(6, hi=10), I(1, hi=1), False, 1, padding_idx=2)]),
    "cdist": Sample(aten._cdist_forward.default, [(F(4, 3), F(5, 3), 2.0, None), (F(2, 4, 3), F(2, 5, 3), 1.0, None),
                                                  (F(4, 3), F(5, 3), float("inf"), None)], F32_64),
    "pdist": Sample(aten._pdist_forward.default, [(F(5, 3),), (F(4, 3), 1.0)], F32_64),
    # --- recurrent -----------------------------------------------------------------------
    "lstm": Sample(aten.lstm.input, [
        (F(5, 2, 3), [F(1, 2, 4), F(1, 2, 4)], [F(16, 3), F(16, 4), F(16), F(16)], True, 1, 0.0, False, False, False),
        (F(2, 5, 3), [F(4, 2, 4), F(4, 2, 4)], [F(16, 3), F(16, 4), F(16), F(16), F(16, 3), F(16, 4), F(16), F(16),
                                                 F(16, 8), F(16, 4), F(16), F(16), F(16, 8), F(16, 4), F(16), F(16)],
         True, 2, 0.0, False, True, True),
        (F(5, 1, 3), [F(1, 1, 2), F(1, 1, 4)], [F(16, 3), F(16, 2), F(2, 4)], False, 1, 0.0, False, False, False)]),
    "gru": Sample(aten.gru.input, [
        (F(5, 2, 3), F(1, 2, 4), [F(12, 3), F(12, 4), F(12), F(12)], True, 1, 0.0, False, False, False),
        (F(2, 5, 3), F(4, 2, 4), [F(12, 3), F(12, 4), F(12), F(12), F(12, 3), F(12, 4), F(12), F(12),
                                  F(12, 8), F(12, 4), F(12), F(12), F(12, 8), F(12, 4), F(12), F(12)],
         True, 2, 0.0, False, True, True)]),
    "rnn_tanh": Sample(aten.rnn_tanh.input, [(F(5, 2, 3), F(1, 2, 4), [F(4, 3), F(4, 4), F(4), F(4)], True, 1, 0.0, False,
                                              False, False)]),
    "rnn_relu": Sample(aten.rnn_relu.input, [(F(5, 2, 3), F(2, 2, 4), [F(4, 3), F(4, 4), F(4, 3), F(4, 4)], False, 1, 0.0,
                                              False, True, False)]),
    # --- sorting and selection -------------------------------------------------------------
    "sort": Sample(aten.sort.default, [(D(4, 5),), (D(4, 5), 0, True), (D(2, 3, 4), -1, True), (NC(3, 4, distinct=True), 1),
                                       C(aten.sort.stable, D(4, 5), stable=True, dim=0, descending=True)]),
    "argsort": Sample(aten.argsort.default, [(D(4, 5),), (D(4, 5), 0, True)]),
    "msort": Sample(aten.msort.default, [(F(4, 5),)]),
    "topk": Sample(aten.topk.default, [(D(4, 6), 2), (D(4, 6), 3, 0), (D(2, 3, 5), 2, -1, False),
                                       (NC(3, 5, distinct=True), 1)]),
    "kthvalue": Sample(aten.kthvalue.default, [(D(4, 6), 2), (D(4, 6), 3, 0, True)]),
    # --- scatter, index_put and friends ---------------------------------------------------
    "scatter": Sample(aten.scatter.src, [(F(4, 5), 0, I(1, 5, hi=4), F(2, 5)), (F(4, 5), 1, I(4, 1, hi=5), F(4, 2)),
                                         (aten.scatter.value, F(4, 5), 0, I(1, 3, hi=4), 1.5),
                                         C(aten.scatter.reduce, F(4, 5), 0, I(3, 5, hi=4), F(3, 5), reduce="add")], NUM),
    "scatter_add": Sample(aten.scatter_add.default, [(F(4, 5), 0, I(6, 5, hi=4), F(6, 5)), (F(4, 5), -1, I(4, 3, hi=5), F(4, 3))], NUM),
    "scatter_reduce": Sample(aten.scatter_reduce.two, [
        (F(4, 5), 0, I(6, 5, hi=4), F(6, 5), "sum"), (F(4, 5), 0, I(6, 5, hi=4), F(6, 5), "amax"),
        C(F(4, 5), 1, I(4, 7, hi=5), F(4, 7), "amin", include_self=False), (F(4, 5, lo=0.5), 0, I(3, 5, hi=4), F(3, 5, lo=0.5), "prod"),
        C(F(4, 5), 0, I(6, 5, hi=4), F(6, 5), "mean", include_self=False)], FLOAT),
    "index_put": Sample(aten.index_put.default, [(F(5, 4), [I(3, hi=5)], F(3, 4), True), (F(5, 4), [I(1, hi=5)], F(4)),
                                                 (F(5, 4), [B(5, 4)], F(1)), (F(5, 4, 3), [None, I(2, hi=4)], F(1, 2, 3), True)],
                        NUM),
    "index_add": Sample(aten.index_add.default, [(F(5, 4), 0, I(3, hi=5), F(3, 4)), C(F(5, 4), 1, I(6, hi=4), F(5, 6), alpha=2)],
                        NUM),
    "index_copy": Sample(aten.index_copy.default, [(F(5, 4), 0, I(1, hi=5), F(1, 4))], NUM),
    "index_fill": Sample(aten.index_fill.int_Scalar, [(F(5, 4), 0, I(3, hi=5), -1.0), (F(5, 4), 1, I(2, hi=4), 2.0)], NUM),
    "masked_scatter": Sample(aten.masked_scatter.default, [(F(4, 5), B(4, 5), F(20)), (F(2, 3, 4), B(3, 1), F(30))], NUM),
    "nonzero": Sample(aten.nonzero.default, [(B(4, 5),), (F(3, 4),), (B(0, 3),)], ANY),
    "one_hot": Sample(aten.one_hot.default, [(I(6, hi=4), 5), (I(2, 3, hi=4), 4)], ANY),
    "select_scatter": Sample(aten.select_scatter.default, [(F(4, 5), F(5), 0, 2), (F(4, 5), F(4), -1, -1)], NUM),
    "slice_scatter": Sample(aten.slice_scatter.default, [(F(6, 5), F(2, 5), 0, 1, 3), (F(6, 5), F(6, 2), 1, 0, 4, 2)], NUM),
    "diagonal_scatter": Sample(aten.diagonal_scatter.default, [(F(4, 5), F(4)), (F(4, 5), F(3), 2), (F(2, 4, 4), F(2, 3), -1, 1, 2)],
                               NUM),
    "diagonal": Sample(aten.diagonal.default, [(F(4, 5),), (F(4, 5), 1), (F(2, 4, 4), -1, 1, 2)], NUM),
    "as_strided": Sample(aten.as_strided.default, [(F(4, 5), [3, 3], [5, 1]), (F(4, 5), [2, 2], [1, 5], 3)], NUM),
    "copy": Sample(aten.copy.default, [(F(4, 5), F(4, 5)), (F(4, 5), F(1, 5)), (F(3, 4), I(3, 4, hi=9))], NUM),
    "fill": Sample(aten.fill.Scalar, [(F(4, 5), 2.5), (aten.fill.Tensor, F(3, 4), F())], NUM),
    "sym_size": Sample(aten.sym_size.int, [(F(4, 5), 1), (F(2, 3, 4), -1)], ANY),
    "sym_numel": Sample(aten.sym_numel.default, [(F(4, 5),)], ANY),
    "sym_stride": Sample(aten.sym_stride.int, [(F(4, 5), 0), (F(2, 3, 4), 1)], ANY),
    "sym_is_contiguous": Sample(aten.sym_is_contiguous.default, [(F(4, 5),)], ANY),
    "resize": Sample(aten.resize_.default, [(F(4, 5), [20]), (F(4, 5), [2, 3]), (F(2, 3, 4), [4, 6])], NUM),
    "sym_storage_offset": Sample(aten.sym_storage_offset.default, [(F(4, 5),)], ANY),
    "item": Sample(aten._local_scalar_dense.default, [(F(),), (F(1),)], NUM),
    # --- FFT -------------------------------------------------------------------------------
    "fft_r2c": Sample(aten._fft_r2c.default, [(F(4, 8), [1], 0, True), (F(4, 6), [0, 1], 2, False), (F(3, 5), [1], 1, True)],
                      ("float32", "float64")),
    "fft_c2r": Sample(aten._fft_c2r.default, [(Z(4, 5), [1], 2, 8), (Z(4, 3), [0, 1], 0, 5)], F32_64),
    "fft_c2c": Sample(aten._fft_c2c.default, [(Z(4, 5), [1], 0, True), (Z(4, 5), [0, 1], 2, False)], F32_64),
    # --- random (shape and dtype only) -----------------------------------------------------
    "rand": Sample(aten.rand.default, [([2, 3],), C([4], dtype=torch.float64)], ANY, values=False),
    "randn": Sample(aten.randn.default, [([2, 3],), C([4], dtype=torch.float64)], ANY, values=False),
    "randperm": Sample(aten.randperm.default, [(7,)], ANY, values=False),
    "rand_like": Sample(aten.rand_like.default, [(F(3, 4),)], FLOAT, values=False),
    "randn_like": Sample(aten.randn_like.default, [(F(3, 4),)], FLOAT, values=False),
    "bernoulli": Sample(aten.bernoulli.default, [(F(3, 4, lo=0, hi=1),)], FLOAT, values=False),
}
