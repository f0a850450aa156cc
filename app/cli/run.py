"""`opscope run MODEL --backend B [--capture export|dynamo]`: run a model, compare with eager PyTorch, show placement."""
from __future__ import annotations

import time

from opscope.runtime.errors import UsageError

from .auto import add_budget, auto_budget, auto_tables
from .common import (add_fallback, add_json, add_model_and_backend, check_specs, console, count_arg, emit_json,
                     fallback_of, fmt_bytes, say, table)

# NOTE: torch and the runtime are imported inside the functions: `opscope run --help` must not pay for them.


def register(sub) -> None:
    p = sub.add_parser("run", help="run a model on a backend and compare with eager PyTorch")
    add_model_and_backend(p)
    add_fallback(p)
    p.add_argument("--repeat", type=count_arg("--repeat"), default=1, help="timed repetitions (the best is reported)")
    p.add_argument("--capture", choices=("export", "dynamo"), default="export",
                   help="export: one graph through torch.export (default); dynamo: torch.compile with the opscope "
                        "backend, for models torch.export cannot capture (regions between graph breaks)")
    p.add_argument("--hybrid", metavar="B=SHARE,...",
                   help="split each batch across backends, e.g. torch:cpu=0.7,sim:npu-a1=0.3 (HybridStrategy)")
    p.add_argument("--switch-threshold", type=count_arg("--switch-threshold", 0), default=0, metavar="N",
                   help="--hybrid: split only when dim 1 of the input (the sequence) is at least N")
    p.add_argument("--plan", metavar="FILE.opsplan",
                   help="run a plan saved by `opscope compile` instead of capturing (MODEL gives inputs and weights)")
    p.add_argument("--trust", metavar="KEYS", action="append",
                   help="--plan: run it only if signed by one of these Ed25519 public keys (an ssh-ed25519 .pub "
                        "file, a file of them, or a folder of .pub files; repeatable)")
    p.add_argument("--recompile", action="store_true",
                   help="--plan: compile again when the plan's description or versions changed (else refused)")
    p.add_argument("--no-tune", action="store_true",
                   help="ignore the configuration `opscope tune` cached for this model and backend")
    add_budget(p)
    add_json(p)
    p.set_defaults(func=main, precheck=precheck)


def precheck(args) -> None:
    """The values and their combinations, before torch is imported (app/cli/__init__.py)."""
    check_specs(args)
    if args.trust and not args.plan:
        raise UsageError("--trust checks a plan's signature: it needs --plan FILE.opsplan")
    if args.hybrid and args.capture != "export":
        raise UsageError("--hybrid splits one exported graph: it cannot be used with --capture dynamo")
    if args.plan and args.capture == "dynamo":
        raise UsageError("--plan runs a saved graph: it cannot be used with --capture dynamo")
    if args.plan:                            # a plan that is not there (or not a file) is one line, now
        from opscope.runtime.passes.plan_archive import open_regular
        open_regular(args.plan, f"plan {args.plan}").close()


def main(args) -> int:
    auto_budget(args)
    if args.hybrid:
        return _hybrid(args)
    if args.capture == "dynamo":
        return _dynamo(args)
    from opscope.profiler.tune import open_tuned_session
    from opscope.runtime.session import compare

    if args.plan:
        import sys
        from opscope.runtime.passes.plan_file import open_plan_session
        from opscope.runtime.passes.plan_sign import load_trusted_keys
        typed = any(a in ("-b", "--backend") or a.startswith("--backend=") for a in sys.argv[1:])
        trust = load_trusted_keys(args.trust) if args.trust else None
        s, tuned = open_plan_session(args.plan, args.model, args.backend if typed else None,
                                     recompile=args.recompile, trust=trust), None
    else:
        s, tuned = open_tuned_session(args.model, args.backend, allow_fallback=fallback_of(args),
                                      use_tuned=not args.no_tune)
    s.run()                                  # warm-up: first-call allocations, lazy init
    from opscope.runtime.step_clock import StepClock
    clock = StepClock() if getattr(s.backend.clock, "simulated", False) else None
    best = host = float("inf")
    for _ in range(args.repeat):
        if clock:
            clock.ns = 0
        t0 = time.perf_counter()
        if clock:
            with s.executor.hooked(clock):
                out = s.run_host()
        else:
            out = s.run_host()
        wall = time.perf_counter() - t0
        host = min(host, wall)
        best = min(best, clock.seconds if clock else wall)
    step_ns = clock.ns if clock else None           # a sim step: the same in every repeat and every command
    err = compare(out, s.eager())
    rep = s.plan.placement.report()
    doc = {"model": args.model, "backend": s.backend.name, "nodes": len(s.graph.nodes), "seconds": best,
           "clock": "simulated" if clock else "wall", "step_ns": step_ns, "host_seconds": host,
           "capture_seconds": s.capture_seconds, "max_abs_err": err["max_abs"], "max_rel_err": err["max_rel"],
           "rel_err_basis": err["rel_basis"], "cosine": err["cosine"], "placement": rep,
           "memory": {"peak_bytes": s.plan.peak_bytes, "constant_bytes": s.plan.constant_bytes},
           "tuned": None if tuned is None else {k: tuned[k] for k in ("config", "speedup", "cache_key")}}
    if err.get("note"):
        doc["error_note"] = err["note"]
    if args.plan:
        doc["plan"] = s.extra["plan"]
    if args.json:
        emit_json(doc)
        return 0
    if tuned:
        console.print(say("{}", tuned["says"]))
    when = (f"{best * 1e3:.2f} ms simulated on {s.backend.name} ({host * 1e3:.2f} ms host wall)" if clock
            else f"{best * 1e3:.2f} ms host wall")
    console.print(say("[bold]{}[/] on [bold]{}[/]: {} ops, {}, peak {} live (+{} weights)", args.model, s.backend.name,
                      len(s.graph.nodes), when, fmt_bytes(s.plan.peak_bytes), fmt_bytes(s.plan.constant_bytes)))
    console.print(accuracy_line(err))
    console.print(table("placement", ["backend", "nodes"], [[b, n] for b, n in rep["nodes_per_backend"].items()],
                        justify_right={"nodes"}))
    if rep.get("auto"):
        auto_tables(rep["auto"])
    if rep.get("regions"):       # a compiler stack's regions (runtime/regions.py): the edges are the only copies
        console.print(table("regions", ["region", "backend", "nodes", "in", "out"],
                            [[g["name"], g["backend"], g["nodes"], fmt_bytes(g["input_bytes"]),
                              fmt_bytes(g["output_bytes"])] for g in rep["regions"]], justify_right={"nodes", "in", "out"}))
    if rep.get("left_out"):
        console.print(table("left out of regions", ["node", "op", "why"],
                            [[o["node"], o["op"], o["reason"]] for o in rep["left_out"]]))
    if rep["fallback_ops"]:
        console.print(table("fell back", ["op", "nodes", "to", "why"],
                            [[f["op"], f["nodes"], f["backend"], f["reason"]] for f in rep["fallback_ops"]]))
        console.print(f"{rep['transfers']} transfers, {fmt_bytes(rep['transfer_bytes'])} moved between backends")
    return 0


def _hybrid(args) -> int:
    from opscope.runtime import models
    from opscope.runtime.backends import resolve
    from opscope.runtime.hybrid import HybridStrategy, run_hybrid
    from opscope.runtime.session import compare, eager_outputs

    strategy = HybridStrategy.parse(args.hybrid, args.switch_threshold)
    for spec in strategy.ratios:                 # a bad backend fails before the model loads
        resolve(spec)
    model, inputs = models.load(args.model)
    cache: dict = {}
    run_hybrid(model, inputs, strategy, _cache=cache)      # warm-up: capture, first-call allocations
    result = run_hybrid(model, inputs, strategy, _cache=cache)
    err = compare(result.outputs, eager_outputs(model, inputs))
    doc = {"model": args.model, "strategy": {"ratios": strategy.ratios, "switch_threshold": strategy.switch_threshold},
           "shares": result.shares, "step_seconds": result.step_seconds, "split_note": result.note,
           "max_abs_err": err["max_abs"], "max_rel_err": err["max_rel"], "rel_err_basis": err["rel_basis"],
           "cosine": err["cosine"]}
    if args.json:
        emit_json(doc)
        return 0
    if result.note:
        console.print(say("[yellow]note: {}[/]", result.note))
    console.print(say("[bold]{}[/] split across {} backend(s): step {:.2f} ms (the slowest share's device time: "
                      "simulated on sim chips, op wall time elsewhere)", args.model, len(result.shares),
                      result.step_seconds * 1e3))
    console.print(accuracy_line(err))
    console.print(table("shares", ["backend", "rows", "device time", "fell back"],
                        [[s["backend"], s["rows"], f"{s['seconds'] * 1e3:.2f} ms", ", ".join(s["fallback_ops"])]
                         for s in result.shares], justify_right={"rows", "device time"}))
    return 0


def _dynamo(args) -> int:
    import logging

    from opscope.runtime.dynamo import open_dynamo_session
    from opscope.runtime.session import compare

    # TorchDynamo logs each graph break as a multi-line warning; the report below lists them once.
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    s = open_dynamo_session(args.model, args.backend, allow_fallback=fallback_of(args))   # compiles, runs once
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
    console.print(say("[bold]{}[/] on [bold]{}[/] through torch.compile: {} regions, {} graph breaks, {} ops, "
                      "{:.2f} ms per call (host wall)", args.model, s.backend.name, stats["regions"],
                      stats["graph_breaks"], stats["nodes"], best * 1e3))
    console.print(accuracy_line(err))
    if stats["break_reasons"]:
        console.print(table("graph breaks (Python runs between regions)", ["reason", "regions"],
                            [[r, n] for r, n in stats["break_reasons"].items()], justify_right={"regions"}))
    console.print(table("placement", ["backend", "nodes"], [[b, n] for b, n in rep["nodes_per_backend"].items()],
                        justify_right={"nodes"}))
    if rep["fallback_ops"]:
        console.print(table("fell back", ["op", "nodes", "to", "why"],
                            [[f["op"], f["nodes"], f["backend"], f["reason"]] for f in rep["fallback_ops"]]))
    return 0


def accuracy_line(err: dict):
    """One line: the errors vs eager PyTorch, what the relative error is measured on, and why a NaN."""
    note = f" ({err['note']})" if err.get("note") else ""
    return say("vs eager PyTorch: max abs err {:.2e}, max rel err {:.2e} (per element, over max(|eager|, 1e-6)), "
               "cosine {:.6f}{}", err["max_abs"], err["max_rel"], err["cosine"], note)
