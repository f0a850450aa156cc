"""Fallbacks for one run: `--fallback torch:cpu` on run / train / profile adds backends after the ones the
description's `fallback = [...]` names, without writing a description.

The extra specs travel where the yes/no of fallback always travelled (`allow_fallback`): True is the
description's chain, False none, a list of specs that chain and then these -- so every road from the CLI to
placement (sessions, the profiler's runner, training, TorchDynamo regions) carries them unchanged.
"""
from __future__ import annotations

import contextvars

from .errors import UsageError
from .hdi import Backend

SUGGESTED = "torch:cpu"        # runs every ATen op and any torch.library op: the way out a refusal names
# How the caller asks for one more fallback, in the words of where the refusal happens: the CLI's flag, or (under
# torch.compile, runtime/dynamo.py) its options key. {spec} is the backend suggested.
ASK = contextvars.ContextVar("opscope_fallback_ask", default="run with --fallback {spec}")


def fallback_chain(backend, allow_fallback) -> list:
    """The backends placement asks, in order, for a node `backend` refuses."""
    if not allow_fallback:
        return []
    chain = backend.fallback_chain()
    if isinstance(allow_fallback, (list, tuple)):
        names = {backend.name} | {b.name for b in chain}
        for spec in allow_fallback:
            extra = spec if isinstance(spec, Backend) else _resolver(backend)(spec)
            if extra.name not in names:
                chain.append(extra)
                names.add(extra.name)
    return chain


def _resolver(backend):
    """How a spec becomes a backend: the resolver of the session that made `backend` (runtime/backends `resolve`
    hands it down), so placement needs no import of the backends above it."""
    resolve = getattr(backend, "resolve_spec", None)
    if resolve is None:
        raise UsageError(f"--fallback: backend {backend.name} was not made by opscope's resolve(); pass the "
                         "fallback backends themselves, not their specs")
    return resolve


def suggestion(backend, chain, lasting: str) -> str:
    """What a user who hit a refusal can do: `lasting` (the description's way), after the one flag that does it
    for this run when torch was not asked yet."""
    if backend.name.startswith("torch") or any(b.name.startswith("torch") for b in chain):
        return lasting
    return f"{ASK.get().format(spec=SUGGESTED)}, or {lasting}"


def parse_flag(values) -> list[str]:
    """`--fallback a,b --fallback c` -> ['a', 'b', 'c'] (each checked when placement resolves it)."""
    out = []
    for v in values or ():
        out += [s.strip() for s in v.split(",") if s.strip()]
    return out
