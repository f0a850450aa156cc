"""`opscope simulate MODEL --hybrid A=0.7,B=0.3 --ranks 1024 [--strategy zero3|tp=2|search] [--overlap]`:
training at N ranks predicted from the measured op costs of one step, the collective cost model and a
parallel strategy; `--measure-link` calibrates the link with a real gloo all-reduce on this host."""
from __future__ import annotations

from opscope.runtime.errors import UsageError

from .common import (MODEL_HELP, add_json, check_specs, console, count_arg, emit_json, fmt_bytes, number_arg, say,
                     table)

HELP = "predict step time, memory per rank and scaling of a parallel strategy at N ranks from measured op costs"


def register(sub) -> None:
    p = sub.add_parser("simulate", help=HELP)
    p.add_argument("model", nargs="?", help=MODEL_HELP + " (optional with --measure-link)")
    p.add_argument("--hybrid", default="sim:npu-a1=1", metavar="SPEC=SHARE,...",
                   help="the backends of one replica and their shares (default sim:npu-a1=1)")
    p.add_argument("--ranks", type=count_arg("--ranks"), action="append", metavar="N",
                   help="ranks to predict for (repeat for several; default 1, 8, 1024)")
    p.add_argument("--strategy", default="dp", metavar="S",
                   help="dp, zero1, zero2, zero3, tp=N, pp=N, or search (every one that fits, ranked); default dp")
    p.add_argument("--overlap", action="store_true", help="gradient buckets all-reduced while backward runs")
    p.add_argument("--bucket-mb", type=number_arg("--bucket-mb", above=0, unit="MB"), default=25.0, metavar="MB",
                   help="--overlap: bucket size (default 25)")
    p.add_argument("--microbatches", type=count_arg("--microbatches"), metavar="M",
                   help="pp: microbatches per step (default 4 x stages)")
    p.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd", help="what the optimizer state holds")
    p.add_argument("--bandwidth", type=number_arg("--bandwidth", above=0, unit="bytes/s"),
                   help="link bandwidth, bytes/s (default: the description's [interconnect], else the measured link, "
                        "else 25 GB/s)")
    p.add_argument("--latency", type=number_arg("--latency", minimum=0, unit="seconds"), help="link latency, seconds")
    p.add_argument("--topology", choices=["ring", "tree", "all-to-all"], help="collective topology")
    p.add_argument("--ranks-per-node", type=count_arg("--ranks-per-node"), metavar="G",
                   help="hierarchical: G ranks per node on the link above, nodes joined by --inter-link")
    p.add_argument("--inter-link", metavar="BW,LAT[,TOPOLOGY]", help="the inter-node link: bytes/s, seconds, "
                                                                      "ring|tree|all-to-all")
    p.add_argument("--cores-per-node", type=count_arg("--cores-per-node"), metavar="C",
                   help="ranks of a node share C cores (wall-clock compute stretches when they run out)")
    p.add_argument("--one-process", action="store_true",
                   help="time host ranks' shares one after another in this process: cheaper (no process per rank), "
                        "less like the job. Default: together, one process per rank stepping in lockstep as "
                        "train --hybrid's ranks do (shared cores, stragglers, their own small all-reduce), as "
                        "benchmarks/bench_dist.py times them")
    p.add_argument("--measure-link", action="store_true", help="measure this host's link first (gloo all-reduce, "
                                                               "2 processes, a few sizes), store and use it")
    p.add_argument("--measured", metavar="RUN", help="a `train --hybrid` run to print beside the prediction "
                                                     "(default: the newest matching one, if any)")
    add_json(p)
    p.set_defaults(func=main, precheck=_checked)


def _inter(text: str | None):
    from opscope.runtime.dist.collectives import Interconnect
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    try:
        bw, lat = float(parts[0]), float(parts[1])
        return Interconnect(bw, lat, parts[2] if len(parts) > 2 else "ring", "--inter-link")
    except (ValueError, IndexError):
        raise UsageError(f"--inter-link {text!r}: expected BANDWIDTH,LATENCY[,TOPOLOGY] (e.g. 1.25e10,1e-5,tree)") \
            from None
    except UsageError as e:          # the link's own check, said with the flag that gave the value
        raise UsageError(f"--inter-link {text!r}: {e}") from None


def _checked(args) -> None:
    """The values and their combinations, before torch is imported (app/cli/__init__.py)."""
    check_specs(args, backends=())
    if args.model is None and not args.measure_link:
        raise UsageError("simulate needs a MODEL (demo:NAME or file.py:factory), or --measure-link alone")
    if (args.ranks_per_node is None) != (args.inter_link is None):
        raise UsageError("--ranks-per-node and --inter-link go together (G ranks per node, the link between nodes)")
    _inter(args.inter_link)          # its numbers checked here, before the model is measured
    if "auto" in args.hybrid:
        raise UsageError("--hybrid for simulate takes fixed shares (A=0.7,B=0.3); `opscope train --hybrid auto` "
                         "measures them")


def main(args) -> int:
    from opscope.runtime import backends
    from opscope.runtime.dist.job import DistJob
    from opscope.runtime.dist.linkbench import measure_link, save_link, stored_link
    from opscope.runtime.dist.simulate import (cluster_of, inter_node_of, link_of, measure, predict,
                                               search_strategies)
    from opscope.runtime.dist.strategies import Strategy

    search = args.strategy.strip().lower() in ("search", "auto")
    strategy = None if search else Strategy.parse(args.strategy)
    inter = _inter(args.inter_link)
    for n in args.ranks or []:          # said before the seconds of measuring, where the model is not needed
        if strategy is not None:
            strategy.check(n)
    job = DistJob.parse(args.model, args.hybrid) if args.model else None
    doc: dict = {}
    if args.measure_link:
        fit = measure_link()
        fit["stored"] = save_link(fit)
        doc["measured_link"] = fit
        if not args.json:
            _print_link(fit)
        if job is None:
            if args.json:
                emit_json(doc)
            return 0
    resolved = [backends.resolve(s) for s in job.specs]
    link = link_of(resolved, stored_link(), bandwidth=args.bandwidth, latency=args.latency, topology=args.topology)
    per_node = args.ranks_per_node
    if inter is None and inter_node_of(resolved):        # the description's second level, unless flags say
        per_node, inter = inter_node_of(resolved)
    measured_run = _measured_run(args)
    ranks = args.ranks or ([measured_run["world_size"]] if measured_run else [1, 8, 1024])
    clusters = {n: cluster_of(n, link, inter, per_node) for n in ranks}
    # what benchmarks/bench_dist.py calls: host ranks timed together unless --one-process (sim chips' exact
    # clocks are timed in this process either way: their step does not depend on the host's cores)
    m = measure(args.model, job.specs, job.ratios, optimizer=args.optimizer, together=not args.one_process)
    for n in ranks:            # a strategy that does not fit is said before any prediction is printed
        if strategy is not None:
            strategy.check(n, m.shapes[m.slowest])
    kw = dict(overlap=args.overlap, bucket_bytes=int(args.bucket_mb * 2 ** 20), microbatches=args.microbatches,
              cores_per_node=args.cores_per_node)
    capacity = _capacity(job.specs[m.slowest])
    doc.update({"model": args.model, "hybrid": args.hybrid, "interconnect": {**vars(link)},
                "shares": m.shares, "gradient_bytes": m.gradient_bytes, "memory_capacity": capacity,
                "clock": " and ".join(sorted({s["clock"] for s in m.shares})), "timing": _timing(m, args)})
    if search:
        doc["search"] = {str(n): [_row(p) for p in search_strategies(m, n, clusters[n], capacity=capacity, **kw)]
                         for n in ranks}
        doc["assumptions"] = [a if not a.startswith("strategy ") else "strategies: every one that fits the ranks "
                              "(runtime/dist/strategies.py), ranked by step time, those that fit in memory first"
                              for a in predict(m, ranks[0], clusters[ranks[0]], **kw)["assumptions"]]
    else:
        rows = [predict(m, n, clusters[n], strategy=strategy, **kw) for n in ranks]
        for r in rows:
            if measured_run and r["ranks"] == measured_run["world_size"]:
                r["measured"] = measured_run
                # predicted vs measured, where both are on the host's clock: a run's step is wall time, and a
                # prediction from a sim chip's shares is on the chip's simulated clock (their ratio says nothing)
                r["error"] = r["step_seconds"] / measured_run["step_seconds"] - 1 if doc["clock"] == "wall" else None
        doc["strategy"] = strategy.name
        doc["predictions"] = [_row(r) for r in rows]
        doc["assumptions"] = rows[0]["assumptions"]
    if args.json:
        emit_json(doc)
        return 0
    _print(args, link, m, doc)
    return 0


def _timing(m, args) -> dict:
    """How the shares were timed: `together` (one process per rank in lockstep, runtime/dist/together.py) or
    `one process` (one after another here), and why."""
    if m.together > 1:
        why = f"{m.together} processes stepping in lockstep on this host, as train --hybrid's ranks run"
    elif args.one_process:
        why = "--one-process"
    elif len(m.shares) == 1:
        why = "one share: no other rank to share the cores with"
    else:
        why = "not every share is a host rank (a sim chip's clock does not depend on the host's cores)"
    return {"shares": "together" if m.together > 1 else "one process", "processes": max(1, m.together), "why": why}


def _row(p: dict) -> dict:
    return {k: v for k, v in p.items() if k not in ("shares", "assumptions", "interconnect", "model")}


def _capacity(spec: str) -> float | None:
    from opscope.runtime import backends
    cap = getattr(getattr(backends.resolve(spec), "description", None), "memory_capacity", 0.0)
    return float(cap) if cap else None


_SHARD_STRATEGY = {"": "dp", "optimizer": "zero1", "gradients": "zero2"}


def _mismatch(dist: dict, args) -> str | None:
    """How a `train --hybrid` run differs from what is predicted (optimizer, strategy, overlap), or None. A run
    that does not say its strategy and overlap (older than issue 39) matches nothing: its demo:gpt "measured"
    step had been an AdamW --shard gradients run beside an SGD data-parallel prediction."""
    ran = {"optimizer": (dist.get("optimizer") or {}).get("name"),
           "strategy": _SHARD_STRATEGY.get(dist["shard"]) if "shard" in dist else None,
           "overlap": dist.get("overlap")}
    want = {"optimizer": args.optimizer, "strategy": args.strategy.strip().lower(), "overlap": bool(args.overlap)}
    diff = [f"{k} {ran[k]} (predicted: {want[k]})" for k in want if ran[k] != want[k]]
    return ", ".join(diff) or None


def _measured_run(args) -> dict | None:
    """The measured step of a `train --hybrid` run of this model and hybrid: --measured, else the newest
    ok one that ran what is predicted: the same optimizer, strategy (--shard) and overlap (shares: --hybrid)."""
    if not args.model:
        return None
    try:
        from opscope.profiler.store import RunStore
        store = RunStore()
        runs = [store.get_run(args.measured)] if args.measured else \
            [r for r in store.list_runs() if r.get("model") == args.model and r.get("status") == "ok"
             and r.get("backend") == f"hybrid:{args.hybrid}"]
    except UsageError:
        if args.measured:
            raise
        return None
    except Exception:          # no store yet, or one another process holds: nothing measured to show
        return None
    for run in runs:
        dist = (run.get("config") or {}).get("dist") or {}
        steps = dist.get("steps") or []
        if not dist.get("step_seconds"):
            if args.measured:
                raise UsageError(f"run {args.measured} is not a `train --hybrid` run with step times")
            continue
        differs = _mismatch(dist, args)
        if differs and args.measured:
            raise UsageError(f"run {args.measured} is not what is predicted: it ran {differs}; give the run of the same "
                             "optimizer, --strategy (dp, zero1 = --shard optimizer, zero2 = --shard gradients) and "
                             "--overlap")
        if not differs:
            return {"run_id": run["run_id"], "world_size": dist["world_size"], "step_seconds": dist["step_seconds"],
                    "steps": len(steps), "clock": "wall"}       # the trainer's step: perf_counter on rank 0
    return None


def _print_link(fit: dict) -> None:
    hot = fit["back_to_back"]
    console.print(say("link measured: gloo all-reduce between {} processes on {}, each after a burst of compute as a "
                      "training step issues it: {:.3g} GB/s, {:.1f} us latency (ring fit, stored in {}; back to back: "
                      "{:.3g} GB/s, {:.1f} us)", fit["ranks"], fit["host"], fit["bandwidth"] / 1e9,
                      fit["latency"] * 1e6, fit["stored"], hot["bandwidth"] / 1e9, hot["latency"] * 1e6))
    console.print(table("all-reduce, measured (wall clock) vs the fitted model", ["bytes", "measured ms", "model ms",
                                                                                 "model/measured"],
                        [[fmt_bytes(p["bytes"]), f"{p['measured_seconds'] * 1e3:.3f}", f"{p['model_seconds'] * 1e3:.3f}",
                          f"{p['model_seconds'] / p['measured_seconds']:.2f}"] for p in fit["points"]],
                        justify_right={"bytes", "measured ms", "model ms", "model/measured"}))


def _measured_cell(r: dict) -> str:
    """A row's measured step and its error, or why the two were not compared (the prediction on another clock)."""
    if not r.get("measured"):
        return "-"
    ms = f"{r['measured']['step_seconds'] * 1e3:.3f} (run {r['measured']['run_id']}"
    return f"{ms}, error {r['error']:+.0%})" if r["error"] is not None else f"{ms}, not compared)"


def _print(args, link, m, doc) -> None:
    console.print(say("[bold]{}[/] over [bold]{}[/]: {} of gradients per step; link {} {:g} GB/s, {:g} us ({})",
                      args.model, args.hybrid, fmt_bytes(m.gradient_bytes), link.topology, link.bandwidth / 1e9,
                      link.latency * 1e6, link.source))
    console.print(table("measured share of one replica", ["backend", "rows", "fwd ms", "bwd ms", "opt ms", "clock"],
                        [[s["backend"], s["rows"], f"{s['forward_seconds'] * 1e3:.3f}",
                          f"{s['backward_seconds'] * 1e3:.3f}", f"{s['optimizer_seconds'] * 1e3:.3f}", s["clock"]]
                         for s in m.shares], justify_right={"rows", "fwd ms", "bwd ms", "opt ms"}))
    console.print(say("shares timed {} ({})", doc["timing"]["shares"], doc["timing"]["why"]))
    mem = lambda p: fmt_bytes(p["memory"]["total"])  # noqa: E731
    # every time below is predicted: the shares' compute on their clock, the collectives from the link's model
    clock = f"compute on the {doc['clock']} clock, collectives from the link model"
    if "search" in doc:
        for n, rows in doc["search"].items():
            console.print(table(f"predicted: strategies on {n} ranks, best first ({clock}" + (
                f"; memory capacity {fmt_bytes(doc['memory_capacity'])} per rank)" if doc["memory_capacity"] else ")"),
                ["strategy", "step ms", "comm ms", "memory/rank", "fits"],
                [[p["strategy"], f"{p['step_seconds'] * 1e3:.3f}", f"{p['communication_seconds'] * 1e3:.3f}", mem(p),
                  "yes" if p["fits"] else "no"] for p in rows], justify_right={"step ms", "comm ms", "memory/rank"}))
    else:
        rows = doc["predictions"]
        cols = ["ranks", "step ms", "measured ms (wall)", "compute ms", "comm ms", "comm share", "efficiency",
                "memory/rank"]
        console.print(table(f"predicted: {doc['strategy']}" + (", overlapped" if args.overlap else "") +
                            f" ({clock}; measured: a train --hybrid run's step)", cols,
                            [[r["ranks"], f"{r['step_seconds'] * 1e3:.3f}", _measured_cell(r),
                              f"{r['compute_seconds'] * 1e3:.3f}", f"{r['communication_seconds'] * 1e3:.3f}",
                              f"{r['communication_share']:.1%}", f"{r['scaling_efficiency']:.1%}", mem(r)]
                             for r in rows], justify_right=set(cols) - {"measured ms (wall)"}))
        if any(r.get("measured") and r["error"] is None for r in rows):
            console.print(say("measured and predicted not compared: a run's step is wall time, the prediction is on "
                              "the {} clock", doc["clock"]))
        r = rows[-1]
        console.print(say("memory per rank at {} ranks: {}", r["ranks"], ", ".join(
            f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in r["memory"].items())))
    console.print("assumptions:")
    for a in doc["assumptions"]:
        console.print(say("  - {}", a))
