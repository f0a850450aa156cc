"""`opscope simulate MODEL --hybrid A=0.7,B=0.3 --ranks 1024`: data-parallel training at N ranks,
predicted from the measured op costs of one step and the collective cost model."""
from __future__ import annotations

from opscope.runtime.errors import UsageError

from .common import MODEL_HELP, add_json, console, emit_json, fmt_bytes, say, table


def register(sub) -> None:
    p = sub.add_parser("simulate", help="predict data-parallel step time and scaling at N ranks from measured op costs")
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--hybrid", default="sim:npu-a1=1", metavar="SPEC=SHARE,...",
                   help="the backends of one replica and their shares (default sim:npu-a1=1)")
    p.add_argument("--ranks", type=int, action="append", metavar="N",
                   help="ranks to predict for (repeat for several; default 1, 8, 1024)")
    p.add_argument("--bandwidth", type=float, help="link bandwidth, bytes/s (default: the description's "
                                                   "[interconnect], else 25 GB/s)")
    p.add_argument("--latency", type=float, help="link latency, seconds")
    p.add_argument("--topology", choices=["ring", "tree", "all-to-all"], help="collective topology")
    add_json(p)
    p.set_defaults(func=main)


def main(args) -> int:
    from opscope.runtime import backends
    from opscope.runtime.dist.job import DistJob
    from opscope.runtime.dist.simulate import Interconnect, measure, predict

    ranks = args.ranks or [1, 8, 1024]
    for n in ranks:
        if n < 1:
            raise UsageError(f"--ranks must be >= 1 (got {n})")
    if "auto" in args.hybrid:
        raise UsageError("--hybrid for simulate takes fixed shares (A=0.7,B=0.3); `opscope train --hybrid auto` "
                         "measures them")
    job = DistJob.parse(args.model, args.hybrid)
    link = Interconnect.of([backends.resolve(s) for s in job.specs], bandwidth=args.bandwidth,
                           latency=args.latency, topology=args.topology)
    measured = measure(args.model, job.specs, job.ratios)
    rows = [predict(measured, n, link) for n in ranks]
    doc = {"model": args.model, "hybrid": args.hybrid, "interconnect": {**vars(link)},
           "shares": measured.shares, "gradient_bytes": measured.gradient_bytes,
           "predictions": [{k: v for k, v in r.items() if k not in ("shares", "assumptions", "interconnect",
                                                                   "model")} for r in rows],
           "assumptions": rows[0]["assumptions"]}
    if args.json:
        emit_json(doc)
        return 0
    console.print(say("[bold]{}[/] data parallel over [bold]{}[/]: {} of gradients all-reduced per step over {} links "
                      "of {:g} GB/s, {:g} us ({})", args.model, args.hybrid, fmt_bytes(measured.gradient_bytes),
                      link.topology, link.bandwidth / 1e9, link.latency * 1e6, link.source))
    console.print(table("measured share of one replica", ["backend", "rows", "compute ms", "clock", "ops"],
                        [[s["backend"], s["rows"], f"{s['compute_seconds'] * 1e3:.3f}", s["clock"], s["ops"]]
                         for s in measured.shares], justify_right={"rows", "compute ms", "ops"}))
    console.print(table("prediction", ["ranks", "step ms", "compute ms", "comm ms", "comm share", "efficiency"],
                        [[r["ranks"], f"{r['step_seconds'] * 1e3:.3f}", f"{r['compute_seconds'] * 1e3:.3f}",
                          f"{r['communication_seconds'] * 1e3:.3f}", f"{r['communication_share']:.1%}",
                          f"{r['scaling_efficiency']:.1%}"] for r in rows],
                        justify_right={"ranks", "step ms", "compute ms", "comm ms", "comm share", "efficiency"}))
    console.print(say("assumptions:\n{}", "\n".join(f"  - {a}" for a in doc["assumptions"])))
    return 0
