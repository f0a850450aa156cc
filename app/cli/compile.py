"""`opscope compile MODEL -b B [--train] [--passes ...] [--sign KEY] -o model.opsplan`: optimize and place once,
save the plan (signed with an Ed25519 key: `ssh-keygen -t ed25519 -N '' -f KEY`; `run --plan --trust KEY.pub`)."""
from __future__ import annotations

from opscope.runtime.errors import UsageError

from .auto import add_budget, auto_budget, auto_tables
from .common import add_json, add_model_and_backend, console, emit_json, fmt_bytes, output_path, say, table


def register(sub) -> None:
    p = sub.add_parser("compile", help="optimize and place a model once, save the execution plan (.opsplan)")
    add_model_and_backend(p)
    p.add_argument("--output", "-o", required=True, metavar="FILE.opsplan", help="where to write the plan")
    p.add_argument("--train", action="store_true", help="compile the training step (forward, backward, optimizer)")
    p.add_argument("--passes", metavar="NAMES",
                   help="comma-separated passes (dce, fold, cse, layout, fuse, memplan), all or none; default: "
                        "every pass the backend description does not switch off in its [passes] table")
    p.add_argument("--sign", metavar="KEY",
                   help="sign the plan with this Ed25519 private key (OpenSSH or PEM, mode 600; make one with "
                        "ssh-keygen -t ed25519 -N '' -f KEY), so `opscope run --plan FILE --trust KEY.pub` runs it")
    add_budget(p)
    add_json(p)
    p.set_defaults(func=main)


def main(args) -> int:
    from opscope.runtime.passes import pass_names
    from opscope.runtime.passes.plan_file import compile_to_file
    if args.passes is not None:
        pass_names(args.passes)                    # an unknown name fails before the model loads
    if not args.output.strip():
        raise UsageError("--output needs a file name, e.g. -o model.opsplan")
    output_path(args.output)                 # a missing folder is a usage error before the capture
    auto_budget(args)
    info = compile_to_file(args.output, args.model, args.backend, passes=args.passes, train=args.train,
                           sign=args.sign)
    if args.json:
        emit_json(info)
        return 0
    t = info["timing"]
    mp = info.get("memory_plan") or {}
    console.print(say("[bold]{}[/] on [bold]{}[/]: {}", args.model, info["backend"]["name"],   # names: say(), not markup
                      f"{info['nodes']} ops after {', '.join(info['passes']) or 'no passes'}; capture "
                      f"{t['capture_seconds'] * 1e3:.0f} ms, passes and placement {t['compile_seconds'] * 1e3:.0f} ms; "
                      f"saved to {args.output}" + (f"; planned peak {fmt_bytes(mp['peak_bytes'])}" if mp else "")
                      + (f"; signed by key {info['signed_by']}" if info.get("signed_by") else "")))
    console.print(table("passes", ["pass", "changes", "ops before", "ops after", "first change"],
                        [[e["pass"], len(e["changes"]), e["nodes_before"], e["nodes_after"],
                          (e["changes"] or [""])[0][:90]] for e in info["pass_log"]],
                        justify_right={"changes", "ops before", "ops after"}))
    if info.get("auto"):
        auto_tables(info["auto"])
    return 0
