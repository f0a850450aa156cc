"""The middle layer: passes over the opscope graph, between capture and placement.

    from opscope.runtime.passes import optimize, pass_names
    graph2, log = optimize(graph, backend, ["dce", "fold", "cse", "fuse"])   # a new Graph; `graph` is untouched
    log.entries      # [{"pass": "fuse", "changes": ["fused add -> layer_norm ...", ...], ...}]
    plan = compile_plan(graph, backend, passes=["fuse", "memplan"])          # what the executor does with them
    save_plan(plan, "gpt.opsplan", model=m, inputs=x); load_plan("gpt.opsplan", model=m, inputs=x)

Each pass is one module with `PASS = Pass(name, requires, run)`; the pipeline is the list below,
in order. A description turns passes on with its `[passes]` table (`fuse = true`); `--passes`
overrides it (`--passes fuse,memplan`, `all`, `none`).
"""
from __future__ import annotations

from ..errors import UsageError
from .catalog import NAMES

# NOTE: the pass modules (and torch behind them) load on first use: description.py reads
# catalog.py through this package, and `opscope migrate scan` must not import torch.


def pipeline() -> list:
    """The passes, in pipeline order."""
    from . import cse, dce, fold, fuse, layout, memplan
    passes = [dce.PASS, fold.PASS, cse.PASS, layout.PASS, fuse.PASS, memplan.PASS]
    assert tuple(p.name for p in passes) == NAMES, "catalog.py and the pipeline must list the same passes"
    return passes


def pass_names(spec) -> list[str]:
    """`--passes` / a list of names -> pipeline-ordered names. "all", "none", or comma-separated names."""
    if spec is None:
        return []
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    items = [str(i).strip() for i in items if str(i).strip()]
    if items in (["all"], ["none"]):
        return list(NAMES) if items == ["all"] else []
    unknown = [i for i in items if i not in NAMES]
    if unknown:
        raise UsageError(f"unknown pass {unknown[0]!r}: passes are {', '.join(NAMES)} (or all, none)")
    return [n for n in NAMES if n in items]


def described(description, *, default: bool = False) -> list[str]:
    """The passes a backend description switches on (`[passes]` table, name = true); with
    `default`, every pass it does not switch off (what `opscope compile` runs)."""
    table = getattr(description, "passes", None) or {}
    return [n for n in NAMES if table.get(n, default) is True]


def optimize(graph, backend, names, *, protected=(), volatile=(), options=None):
    """Run the named passes (pipeline order) on a copy of `graph`; returns (new graph, PassLog)."""
    import time

    from .base import Context, PassLog, copy_graph, output_slots
    names = pass_names(names)
    passes = {p.name: p for p in pipeline()}
    log = PassLog()
    g = copy_graph(graph)
    ctx = Context(backend, set(protected) | output_slots(g), set(volatile), dict(options or {}))
    for name in names:
        p = passes[name]
        before = len(g.nodes)
        t0 = time.perf_counter()
        changes = p.run(g, ctx)
        log.add(name, changes, before, len(g.nodes), seconds=time.perf_counter() - t0,
                requires=list(p.requires))
    return g, log


__all__ = ["NAMES", "described", "optimize", "pass_names", "pipeline"]
