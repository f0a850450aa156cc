"""`opscope diff MODEL -b B --reference R`: every op's output against a reference backend, headless.

The accuracy report msprobe and Polygraphy users expect: per op cosine, max abs and max rel error,
the error this op introduced (its reference kernel on the backend's own inputs) against what it
inherited, the dtype's tolerance, pass/fail, module path and source line, msprobe's one-thousandth
and five-thousandths ratios; the first failing op, and the ops ranked by the error they introduced
with the first whose own error is more than rounding explains (under tolerance too).
"""
from __future__ import annotations

import sys

from .common import add_model_and_backend, check_specs, console, number_arg, say, table


def register(sub) -> None:
    p = sub.add_parser("diff", help="every op's output against a reference backend (accuracy report)",
                       description="Run the model on a backend and, op by op, on a reference backend; report every "
                                   "op's error, where error was introduced, and the first failing op.")
    add_model_and_backend(p)
    p.add_argument("--reference", "-r", default="numpy", metavar="R", help="the reference backend (default numpy)")
    p.add_argument("--tolerance", type=number_arg("--tolerance", above=0), metavar="X",
                   help="error (max abs scaled by the reference's largest value) that fails an op (default: per dtype)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    fmt.add_argument("--csv", action="store_true", help="print the per-op table as CSV on stdout")
    p.add_argument("--output", "-o", metavar="FILE", help="write the report to FILE (.csv or .json) as well")
    p.add_argument("--all", action="store_true", help="list every op (default: failing and NaN ops, and a summary)")
    p.set_defaults(func=main, precheck=check_specs)          # the specs, before torch is imported


def main(args) -> int:
    if args.output:
        from opscope.debugger.report import check_report_path
        check_report_path(args.output)
    from opscope.debugger.pystack import open_debug_session
    from opscope.debugger.report import run_report
    from opscope.runtime import backends

    backends.resolve(args.reference)             # a bad reference fails before the model loads
    session = open_debug_session(args.model, args.backend)
    report = run_report(session, args.reference, args.tolerance)
    if args.output:
        report.write(args.output)
    if args.json:
        sys.stdout.write(report.json_text())
    elif args.csv:
        sys.stdout.write(report.csv_text())
    else:
        _print(report, args.all)
    return 0


def _print(report, every: bool) -> None:
    from opscope.debugger.stats import fmt
    s = report.summary()
    rows = [r for r in report.rows if every or r.status != "pass"]
    console.print(say("[bold]{}[/] on [bold]{}[/] vs [bold]{}[/]: {} ops, {} pass, {} fail, {} NaN on both sides, "
                      "{} not compared", report.model, report.backend, report.reference, s["ops"],
                      s["counts"]["pass"], s["counts"]["fail"], s["counts"]["nan"], s["counts"]["skip"]))
    if rows:
        console.print(table("ops" if every else "ops that fail or hold NaN/Inf",
                            ["#", "node", "op", "status", "err", "this op", "cosine", "max abs", "error from", "module"],
                            [[r.number, r.node, r.op, r.status, fmt(r.err), fmt(r.local_err),
                              "-" if r.cosine != r.cosine else f"{r.cosine:.6f}", fmt(r.max_abs), r.error_from,
                              r.module] for r in rows],
                            justify_right={"#", "err", "this op", "cosine", "max abs"}))
        console.print("[dim]--csv / --json / -o FILE have every column: max rel, tolerance, source line, "
                      "msprobe's 1/1000 and 5/1000 ratios, verdict[/]")
    ranked = report.ranked()
    if ranked:       # where the error came from, under tolerance too: what each op added itself
        console.print(table("ops ranked by the error they introduced themselves",
                            ["#", "node", "op", "this op", "from inputs", "tol", "significant", "module"],
                            [[r.number, r.node, r.op, fmt(r.local_err), fmt(r.received_err), fmt(r.tolerance),
                              "yes" if r.significant else "", r.module] for r in ranked],
                            justify_right={"#", "this op", "from inputs", "tol"}))
    console.print(say("{}", s["line"]))
