"""`opscope debug MODEL --backend B`: the terminal debugger (Textual)."""
from __future__ import annotations

import sys

from opscope.runtime.errors import UsageError

from .common import OPTIMIZERS, add_model_and_backend, check_specs, number_arg, port_arg


def register(sub) -> None:
    p = sub.add_parser("debug", help="step through a model op by op in a terminal UI",
                       description="Step through a model one op at a time; inspect tensors, set breakpoints, "
                                   "watch values, compare every op with a reference backend.")
    add_model_and_backend(p)
    p.add_argument("--reference", metavar="B", help="run every op also on this backend (e.g. numpy) and compare")
    p.add_argument("--tolerance", type=number_arg("--tolerance", above=0), metavar="X",
                   help="error (scaled max abs) above which --reference stops (default: per dtype)")
    p.add_argument("--report", metavar="FILE", help="with --reference: write the accuracy report of every op "
                                                    "run (.csv or .json) when the run ends or the debugger quits")
    p.add_argument("--break", dest="breaks", action="append", default=[], metavar="SPEC",
                   help="breakpoint: op type (linear), path glob (layers.0.*), condition (nan, new-nan, max_abs > 1e4, "
                        "err > 1e-3) or 'GLOB if COND'; repeatable. One that matches no op is refused")
    p.add_argument("--break-on-nan", action="store_true",
                   help="stop at every op that makes a NaN or Inf (not at the ops that only carry one on)")
    # at most 1e9 MB (a petabyte): the budget becomes an int of bytes, and int(1e308 MB) overflowed in the worker
    p.add_argument("--history-mb", type=number_arg("--history-mb", minimum=0, maximum=1e9, unit="MB"), default=256,
                   metavar="MB",
                   help="memory for the values of ops already run, for stepping back with p (default 256; "
                        "older ops keep their stats only)")
    p.add_argument("--capture", choices=("export", "dynamo"), default="export",
                   help="export: one graph through torch.export (default); dynamo: torch.compile with the opscope "
                        "backend, stepping through the ops of every region between graph breaks")
    p.add_argument("--train", action="store_true",
                   help="debug a whole training step: forward, backward and the optimizer (the model returns its loss)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, help="with --train: the optimizer (default sgd)")
    p.add_argument("--lr", type=number_arg("--lr", above=0), metavar="X",
                   help="with --train: learning rate (default 1e-2 sgd, 1e-3 adamw)")
    p.add_argument("--debugpy", nargs="?", const=5678, type=port_arg("--debugpy"), metavar="PORT",
                   help="listen for a debugger (VS Code attach) on 127.0.0.1:PORT (default 5678)")
    p.set_defaults(func=main, precheck=precheck)


def precheck(args) -> None:
    """The values and their combinations, before torch is imported (app/cli/__init__.py): a typo costs a
    tenth of a second, not torch's import."""
    check_specs(args)
    if args.tolerance is not None and not args.reference:
        raise UsageError("--tolerance needs --reference (e.g. --reference numpy)")
    if args.report and not args.reference:
        raise UsageError("--report needs --reference (e.g. --reference numpy): it compares every op with it")
    if not args.train and (args.lr is not None or args.optimizer is not None):
        raise UsageError("--optimizer and --lr need --train (debug a training step)")
    if args.train and args.capture != "export":
        raise UsageError("--train captures forward and backward as one graph: it cannot be used with --capture dynamo")


def main(args) -> int:
    # only what checks the flags is imported here: the TUI opens first, then imports torch and
    # captures the model in a worker while it shows progress
    if args.report:
        from opscope.debugger.report import check_report_path
        check_report_path(args.report)
    from opscope.debugger import breakpoints as bps
    for spec in args.breaks:            # bad specs fail before the model loads
        bps.parse(spec)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):   # a TUI drawn into a file would wait forever
        raise UsageError("opscope debug needs a terminal (stdin and stdout are not one): run it in a terminal, or "
                         "`opscope diff MODEL -b B` for the accuracy report without one")
    notice = ""
    if args.debugpy is not None:
        from opscope.debugger import debugpy as dbg
        host, port = dbg.listen(args.debugpy)
        notice = f"debugpy listening on {host}:{port}"
        print(f"{notice} (VS Code: attach to it)")

    def load(progress):
        progress("importing torch and opscope...")
        from opscope.debugger.controller import Controller
        from opscope.debugger.pystack import open_debug_session
        from opscope.runtime import backends
        if args.reference:
            backends.resolve(args.reference)
        progress(f"capturing {args.model} (torch.export) and placing it on {args.backend}...")
        if args.train:
            from opscope.debugger.train import open_train_session
            from opscope.runtime.train import DEFAULT_LR, OptimizerSpec
            progress(f"capturing the training step of {args.model} (forward, backward, {args.optimizer})...")
            args.optimizer = args.optimizer or "sgd"
            lr = args.lr if args.lr is not None else DEFAULT_LR[args.optimizer]
            session = open_train_session(args.model, args.backend, OptimizerSpec(args.optimizer, lr=lr))
        elif args.capture == "dynamo":
            from opscope.runtime.dynamo import open_dynamo_session
            progress(f"compiling {args.model} with torch.compile (opscope backend on {args.backend})...")
            session = open_dynamo_session(args.model, args.backend)
        else:
            session = open_debug_session(args.model, args.backend)
        ctl = Controller(session, reference=args.reference, tolerance=args.tolerance, breakpoints=args.breaks,
                         break_on_nan=args.break_on_nan, use_debugpy=args.debugpy is not None,
                         history_mb=args.history_mb)
        dead = ctl.breakpoints.dead([st.node for st in ctl.steps])
        if dead:
            raise UsageError(dead[0])
        return ctl

    from opscope.debugger.app import DebuggerApp
    app = DebuggerApp(model=args.model, loader=load, report_path=args.report, notice=notice, handle_sigint=True)
    app.run()
    if app.load_error is not None:
        raise app.load_error
    if app.return_code == 130:           # Ctrl-C when nothing runs, or SIGINT: end as every command does,
        raise KeyboardInterrupt          # "opscope: interrupted" in one line, exit 130
    return app.return_code or 0          # q: 0
