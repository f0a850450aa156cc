"""`@operator`: define a new hardware-agnostic op that every backend runs.

    @operator
    def swiglu(x, w_gate, w_up):
        return torch.nn.functional.silu(x @ w_gate) * (x @ w_up)

The function body (torch code) is the op's definition. opscope registers it as the torch custom
op `opscope::swiglu`, so a model that calls it is captured as one `swiglu` node. Backends that
have a kernel for `swiglu` run it natively; the others run its decomposition -- the body captured
into opscope ops -- so a composite works everywhere from the day it is written. A new primitive
passes `reference=` (a numpy kernel); backends then run that, or their own registered kernel.
"""
from __future__ import annotations

import inspect

import torch

from .registry import ALL_DTYPES, OPS, OpDef


def operator(fn=None, *, name: str | None = None, reference=None, flops=None, kind: str = "custom"):
    """Make a Python function an opscope op: a model that calls it is captured as one node of that name.

    The function's body is the op's definition (torch code): backends with a kernel registered for the name
    run that kernel, the others run the definition. `reference` is a numpy kernel for the reference backend,
    `flops` a cost model for the profiler, `name` overrides the function's name.
    """
    def wrap(f):
        op_name = name or f.__name__
        params = list(inspect.signature(f).parameters)
        custom = torch.library.custom_op(f"opscope::{op_name}", mutates_args=())(_annotated(f, params))
        custom.register_fake(f)
        OPS[op_name] = OpDef(op_name, kind, reference, (), flops, ALL_DTYPES,
                             (f.__doc__ or "").strip(), torch=f, composite=None if reference else f)
        custom.opdef = OPS[op_name]
        return custom

    return wrap(fn) if fn is not None else wrap


def _annotated(f, params):
    # torch.library infers the schema from annotations; user ops take and return tensors.
    def impl(*args):
        return f(*args)

    impl.__name__ = f.__name__
    impl.__signature__ = inspect.Signature(
        [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=torch.Tensor) for p in params],
        return_annotation=torch.Tensor)
    return impl
