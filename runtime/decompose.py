"""Decomposition: a composite op runs on a backend with no kernel for it by capturing its body into
opscope ops and executing that subgraph on the same backend.

Two kinds of composite share this: a user's `@operator` (every argument a tensor) and an ATen op the
op set defines as a composition (`slice_backward` is zeros + `slice_scatter`; runtime/ops/registry.py
`composition`), whose non-tensor arguments (sizes, dims) are fixed per node and baked into the body.
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
    graph = capture(_Body(body), examples, name=node.op)
    sub = Executor(compile_plan(graph, backend))

    def run(*args, **kwargs):
        values = _tensors_of(template[0], args, [])
        for k, v in template[1].items():
            _tensors_of(v, kwargs.get(k), values)
        outs = sub.run(*values)
        return outs[0] if len(outs) == 1 else outs

    cache[key] = run
    return run
