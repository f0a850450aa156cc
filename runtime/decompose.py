"""Decomposition: a composite `@operator` runs on a backend with no kernel for it by capturing
its body into opscope ops and executing that subgraph on the same backend."""
from __future__ import annotations

import torch

from .dtypes import to_torch


class _Body(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def decomposed_kernel(node, backend):
    from .capture import capture
    from .executor import Executor, compile_plan
    from .ops import OPS

    fn = OPS[node.op].composite
    examples = tuple(torch.zeros(m.shape, dtype=to_torch(m.dtype)) for m in node.input_meta)
    graph = capture(_Body(fn), examples, name=node.op)
    sub = Executor(compile_plan(graph, backend))

    def run(*args):
        outs = sub.run(*args)
        return outs[0] if len(outs) == 1 else outs

    return run
