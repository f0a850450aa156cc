"""`opscope debug MODEL --backend B`: the terminal debugger (Textual)."""
from __future__ import annotations

import argparse

from opscope.runtime.errors import UsageError

from .common import add_model_and_backend


def register(sub) -> None:
    p = sub.add_parser("debug", help="step through a model op by op in a terminal UI",
                       description="Step through a model one op at a time; inspect tensors, set breakpoints, "
                                   "watch values, compare every op with a reference backend.")
    add_model_and_backend(p)
    p.add_argument("--reference", metavar="B", help="run every op also on this backend (e.g. numpy) and compare")
    p.add_argument("--tolerance", type=float, metavar="X",
                   help="error (scaled max abs) above which --reference stops (default: per dtype)")
    p.add_argument("--break", dest="breaks", action="append", default=[], metavar="SPEC",
                   help="breakpoint: op type (linear), path glob (layers.0.*), condition (nan, max_abs > 1e4, "
                        "err > 1e-3) or 'GLOB if COND'; repeatable")
    p.add_argument("--break-on-nan", action="store_true", help="stop at any op whose output holds NaN or Inf")
    p.add_argument("--debugpy", nargs="?", const=5678, type=_port, metavar="PORT",
                   help="listen for a debugger (VS Code attach) on 127.0.0.1:PORT (default 5678)")
    p.set_defaults(func=main)


def main(args) -> int:
    from opscope.debugger import breakpoints as bps
    from opscope.runtime import backends, open_session

    if args.tolerance is not None and not args.tolerance > 0:      # NaN too
        raise UsageError(f"--tolerance {args.tolerance}: give a positive number, e.g. 1e-3")
    if args.tolerance is not None and not args.reference:
        raise UsageError("--tolerance needs --reference (e.g. --reference numpy)")
    for spec in args.breaks:            # bad specs fail before the model loads
        bps.parse(spec)
    if args.reference:
        backends.resolve(args.reference)
    session = open_session(args.model, args.backend)
    from opscope.debugger.app import DebuggerApp
    from opscope.debugger.controller import Controller

    if args.debugpy is not None:
        from opscope.debugger import debugpy as dbg
        host, port = dbg.listen(args.debugpy)
        print(f"debugpy listening on {host}:{port} (VS Code: attach to it)")
    ctl = Controller(session, reference=args.reference, tolerance=args.tolerance, breakpoints=args.breaks,
                     break_on_nan=args.break_on_nan, use_debugpy=args.debugpy is not None)
    DebuggerApp(ctl, model=args.model).run()
    return 0


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: give a number, e.g. 5678") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range: give 1..65535 (0 picks a free one)")
    return port
