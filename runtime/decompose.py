"""Decomposition: a composite op runs on a backend with no kernel for it by capturing its body into
opscope ops and executing that subgraph on the same backend.

Three kinds of composite share this: a user's `@operator` (every argument a tensor), an ATen op the op
set defines as a composition (`slice_backward` is zeros + `slice_scatter`; runtime/ops/registry.py
`composition`), and any other op with a CompositeImplicitAutograd kernel -- ATen's own definition in
other ops (`einsum`, `cross_entropy_loss`, `kl_div`), or a library's torch.library op -- which capture
registers under its name the first time it meets one (runtime/capture.py `implicit_composite`). Non-tensor arguments
(sizes, dims) are fixed per node and baked into the body.
"""
from __future__ import annotations

import torch

from .dtypes import to_torch
from .graph import Ref


class _Body(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _fill(a, tensors):
    """`a` with each Ref replaced by the next of `tensors` (the order capture listed the node's inputs in)."""
    if isinstance(a, Ref):
        return next(tensors)
    if isinstance(a, (list, tuple)):
        return type(a)(_fill(x, tensors) for x in a)
    return a


class _Marks:
    """An endless iterator of one placeholder: a call's arguments with its tensors blanked out."""

    def __next__(self):
        return "<tensor>"


def _tensors_of(template, value, out):
    """The values at the Ref positions of `template` (the node's args) within `value` (the call's args)."""
    if isinstance(template, Ref):
        out.append(value)
    elif isinstance(template, (list, tuple)):
        for t, v in zip(template, value):
            _tensors_of(t, v, out)
    return out


def decomposed_kernel(node, backend):
    from .capture import capture
    from .executor import Executor, compile_plan
    from .ops import OPS

    fn = OPS[node.op].composite
    template = (tuple(node.args), dict(node.kwargs))
    # one capture per distinct call on a backend: a model's layers repeat the same slice_backward
    key = (node.op, repr(_fill(template[0], _Marks())), repr({k: _fill(v, _Marks()) for k, v in template[1].items()}),
           tuple((tuple(m.shape), m.dtype) for m in node.input_meta))
    cache = backend.__dict__.setdefault("_decompositions", {})
    if key in cache:
        return cache[key]

    def body(*tensors):
        it = iter(tensors)
        args, kwargs = _fill(template[0], it), {k: _fill(v, it) for k, v in template[1].items()}
        return fn(*args, **kwargs)

    examples = tuple(torch.zeros(m.shape, dtype=to_torch(m.dtype)) for m in node.input_meta)
    if OPS[node.op].extra.get("implicit"):
        # torch.export would keep the composite op whole; make_fx traces below CompositeImplicitAutograd
        from torch.fx.experimental.proxy_tensor import make_fx

        from .capture import translate
        try:
            graph = translate(make_fx(body)(*examples).graph, node.op)
        except Exception:  # a definition that cannot be traced here (data-dependent): no kernel, so it falls back
            return None
    else:
        graph = capture(_Body(body), examples, name=node.op)
    if any(n.op == node.op for n in graph.nodes):
        return None                       # it does not decompose: no kernel, rather than recursing
    from .errors import UnsupportedOpError
    try:        # all of it on this backend, or none: the node falls back whole, and placement says so
        sub = Executor(compile_plan(graph, backend, allow_fallback=False))
    except UnsupportedOpError:
        return None

    def run(*args, **kwargs):
        values = _tensors_of(template[0], args, [])
        for k, v in template[1].items():
            _tensors_of(v, kwargs.get(k), values)
        outs = sub.run(*values)
        return outs if node.multi_output else outs[0]       # a list of one (meshgrid of one) stays a list

    cache[key] = run
    return run
