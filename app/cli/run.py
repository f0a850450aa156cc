"""`opscope run MODEL --backend B [--capture export|dynamo]`: run a model, compare with eager PyTorch, show placement."""
from __future__ import annotations

import time

from opscope.runtime import open_session
from opscope.runtime.errors import UsageError
from opscope.runtime.session import compare, eager_outputs

from .common import add_json, add_model_and_backend, console, emit_json, fmt_bytes, table


def register(sub) -> None:
    p = sub.add_parser("run", help="run a model on a backend and compare with eager PyTorch")
    add_model_and_backend(p)
    p.add_argument("--no-fallback", action="store_true", help="fail, listing every op the backend cannot run")
    p.add_argument("--repeat", type=int, default=1, help="timed repetitions (the best is reported)")
    p.add_argument("--capture", choices=("export", "dynamo"), default="export",
                   help="export: one graph through torch.export (default); dynamo: torch.compile with the opscope "
                        "backend, for models torch.export cannot capture (regions between graph breaks)")
    p.add_argument("--hybrid", metavar="B=SHARE,...",
                   help="split each batch across backends, e.g. torch:cpu=0.7,sim:npu-a1=0.3 (HybridStrategy)")
    p.add_argument("--switch-threshold", type=int, default=0, metavar="N",
                   help="--hybrid: split only when dim 1 of the input (the sequence) is at least N")
    add_json(p)
    p.set_defaults(func=main)


def main(args) -> int:
    if args.repeat < 1 or args.switch_threshold < 0:
        raise UsageError(f"--repeat must be >= 1 and --switch-threshold >= 0 (got {args.repeat} and "
                         f"{args.switch_threshold})")
    if args.hybrid:
        if args.capture != "export":
            raise UsageError("--hybrid splits one exported graph: it cannot be used with --capture dynamo")
        return _hybrid(args)
    if args.capture == "dynamo":
        return _dynamo(args)
    s = open_session(args.model, args.backend, allow_fallback=not args.no_fallback)
    s.run()                                  # warm-up: first-call allocations, lazy init
    best = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        out = s.run_host()
        best = min(best, time.perf_counter() - t0)
    err = compare(out, s.eager())
    rep = s.plan.placement.report()
    doc = {"model": args.model, "backend": s.backend.name, "nodes": len(s.graph.nodes), "seconds": best,
           "capture_seconds": s.capture_seconds, "max_abs_err": err["max_abs"], "max_rel_err": err["max_rel"],
           "cosine": err["cosine"], "placement": rep,
           "memory": {"peak_bytes": s.plan.peak_bytes, "constant_bytes": s.plan.constant_bytes}}
    if args.json:
        emit_json(doc)
        return 0
    console.print(f"[bold]{args.model}[/] on [bold]{s.backend.name}[/]: {len(s.graph.nodes)} ops, "
                  f"{best * 1e3:.2f} ms, peak {fmt_bytes(s.plan.peak_bytes)} live (+{fmt_bytes(s.plan.constant_bytes)} weights), max abs err {err['max_abs']:.2e}, max rel err {err['max_rel']:.2e} vs eager PyTorch")
    console.print(table("placement", ["backend", "nodes"], [[b, n] for b, n in rep["nodes_per_backend"].items()],
                        justify_right={"nodes"}))
    if rep["fallback_ops"]:
        console.print(table("fell back", ["op", "nodes", "to", "why"],
                            [[f["op"], f["nodes"], f["backend"], f["reason"]] for f in rep["fallback_ops"]]))
        console.print(f"{rep['transfers']} transfers, {fmt_bytes(rep['transfer_bytes'])} moved between backends")
    return 0


def _hybrid(args) -> int:
    from opscope.runtime import models
    from opscope.runtime.backends import resolve
    from opscope.runtime.hybrid import HybridStrategy, run_hybrid

    strategy = HybridStrategy.parse(args.hybrid, args.switch_threshold)
    for spec in strategy.ratios:                 # a bad backend fails before the model loads
        resolve(spec)
    model, inputs = models.load(args.model)
    cache: dict = {}
    run_hybrid(model, inputs, strategy, _cache=cache)      # warm-up: capture, first-call allocations
    result = run_hybrid(model, inputs, strategy, _cache=cache)
    err = compare(result.outputs, eager_outputs(model, inputs))
    doc = {"model": args.model, "strategy": {"ratios": strategy.ratios, "switch_threshold": strategy.switch_threshold},
           "shares": result.shares, "step_seconds": result.step_seconds, "max_abs_err": err["max_abs"],
           "max_rel_err": err["max_rel"], "cosine": err["cosine"]}
    if args.json:
        emit_json(doc)
        return 0
    console.print(f"[bold]{args.model}[/] split across {len(result.shares)} backend(s): step "
                  f"{result.step_seconds * 1e3:.2f} ms (slowest share), max abs err {err['max_abs']:.2e} vs eager PyTorch")
    console.print(table("shares", ["backend", "rows", "device time", "fell back"],
                        [[s["backend"], s["rows"], f"{s['seconds'] * 1e3:.2f} ms", ", ".join(s["fallback_ops"])]
                         for s in result.shares], justify_right={"rows", "device time"}))
    return 0


def _dynamo(args) -> int:
    import logging

    from opscope.runtime.dynamo import open_dynamo_session

    # TorchDynamo logs each graph break as a multi-line warning; the report below lists them once.
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    s = open_dynamo_session(args.model, args.backend, allow_fallback=not args.no_fallback)   # compiles, runs once
    best = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        out = s.run_host()
        best = min(best, time.perf_counter() - t0)
    err = compare(out, s.eager())
    stats = s.dynamo.stats()
    rep = stats["placement"]
    peak = max((p.peak_bytes for p in s.dynamo.plans), default=0)
    doc = {"model": args.model, "backend": s.backend.name, "capture": "dynamo", "nodes": stats["nodes"],
           "seconds": best, "capture_seconds": s.capture_seconds, "max_abs_err": err["max_abs"],
           "max_rel_err": err["max_rel"], "cosine": err["cosine"], "placement": rep,
           "regions": stats["regions"], "graph_breaks": stats["graph_breaks"], "break_reasons": stats["break_reasons"],
           "region_calls": stats["region_calls"], "memory": {"peak_bytes": peak}}
    if args.json:
        emit_json(doc)
        return 0
    console.print(f"[bold]{args.model}[/] on [bold]{s.backend.name}[/] through torch.compile: {stats['regions']} "
                  f"regions, {stats['graph_breaks']} graph breaks, {stats['nodes']} ops, {best * 1e3:.2f} ms per call, "
                  f"max abs err {err['max_abs']:.2e}, max rel err {err['max_rel']:.2e} vs eager PyTorch")
    if stats["break_reasons"]:
        console.print(table("graph breaks (Python runs between regions)", ["reason", "regions"],
                            [[r, n] for r, n in stats["break_reasons"].items()], justify_right={"regions"}))
    console.print(table("placement", ["backend", "nodes"], [[b, n] for b, n in rep["nodes_per_backend"].items()],
                        justify_right={"nodes"}))
    if rep["fallback_ops"]:
        console.print(table("fell back", ["op", "nodes", "to", "why"],
                            [[f["op"], f["nodes"], f["backend"], f["reason"]] for f in rep["fallback_ops"]]))
    return 0
