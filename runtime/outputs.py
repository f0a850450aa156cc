"""A model's outputs as tensors, when they hold objects torch's pytree does not know.

transformers' decoders return their KV cache by default (`use_cache=True`): a `DynamicCache` whose layers hold
each layer's keys and values. torch.export refuses such an output outright ("Found DynamicCache in output, which is
not a known type"), so the model could not be captured at all. Capture instead traces the model with every such
object replaced by the tuple of tensors it holds, in attribute order (layer 0's keys, values, layer 1's ...): the
cache's tensors stay outputs a user can read and compare, and eager outputs flatten the same way
(`held_tensors`), so both sides line up. Outputs pytree knows (tensors, tuples, ModelOutput) are left as they are.

    with tensor_outputs(model):
        ep = torch.export.export(model, inputs)     # logits, then the cache's keys and values
"""
from __future__ import annotations

import contextlib
import functools

import torch
import torch.utils._pytree as pytree

_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.SymInt, torch.SymFloat, torch.SymBool,
          torch.dtype, torch.device)


def held_tensors(obj, _seen: set | None = None) -> list[torch.Tensor]:
    """Every tensor `obj` holds -- through lists, tuples, dicts and object attributes -- in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, _PLAIN + (type, torch.nn.Module)) or callable(obj):
        return []              # a module or a function reached from a cache is not part of its value
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple)):
        items = obj
    elif hasattr(obj, "__dict__"):
        items = vars(obj).values()
    else:
        return []
    return [t for x in items for t in held_tensors(x, seen)]


def _as_tensors(out):
    """`out` with each leaf pytree does not know, and that holds tensors, replaced by the tuple of them."""
    leaves, spec = pytree.tree_flatten(out)
    unknown = [i for i, x in enumerate(leaves) if not isinstance(x, (torch.Tensor,) + _PLAIN) and held_tensors(x)]
    if not unknown:
        return out
    for i in unknown:
        leaves[i] = tuple(held_tensors(leaves[i]))
    return pytree.tree_unflatten(leaves, spec)


@contextlib.contextmanager
def tensor_outputs(model: torch.nn.Module):
    """While the block runs, `model(...)` returns its outputs with cache-like objects as tuples of tensors.

    The instance's forward is wrapped (functools.wraps keeps the signature, so torch.export names the inputs as
    the model does) and restored after."""
    own = vars(model).get("forward")
    forward = model.forward

    @functools.wraps(forward)
    def flat(*args, **kwargs):
        return _as_tensors(forward(*args, **kwargs))

    try:
        model.forward = flat
    except (AttributeError, TypeError, RuntimeError):     # a module that forbids it (ScriptModule): as it is
        yield model
        return
    try:
        yield model
    finally:
        if own is None:
            del model.forward
        else:
            model.forward = own
