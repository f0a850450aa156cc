"""`opscope advise RUN [--json] [--rules FILE] [--apply ID]`: what to change, why, how much it
should gain -- and with --apply, a new run that measures it."""
from __future__ import annotations

import sys
from contextlib import nullcontext

from .common import add_json, console, emit_json, fmt_ns, say, table, terminal_text


def register(sub) -> None:
    p = sub.add_parser("advise", help="recommendations for a run, ranked by estimated gain; --apply measures one")
    p.add_argument("run", help="a run id (or a unique prefix); `opscope runs` lists them")
    p.add_argument("--rules", action="append", default=[], metavar="FILE",
                   help="a rule pack (.toml) on top of the bundled ones; a rule with the same id replaces it")
    p.add_argument("--apply", metavar="ID", help="re-run with this advice applied and report estimated vs measured gain")
    add_json(p)
    p.set_defaults(func=main)


def main(args) -> int:
    from opscope.profiler.advisor import report
    from opscope.profiler.store import RunStore

    store = RunStore()
    run = store.get_run(args.run)
    skipped: list = []
    analyses, advice = report(run["run_id"], store, args.rules, skipped)
    for s in skipped:          # a note, not an error: the other rules' advice stands (engine.evaluate)
        print(terminal_text(f"opscope: note: rule {s['rule']!r} skipped, this run's data broke it: {s['reason']}"),
              file=sys.stderr)
    if args.apply is not None:
        from opscope.profiler.advisor.apply import apply_advice
        busy = nullcontext() if args.json else console.status(f"applying {args.apply} and re-running {run['model']}...")
        with busy:
            result = apply_advice(run["run_id"], args.apply, store=store, advice=advice, analyses=analyses)
        if args.json:
            emit_json(result)
        else:
            _print_apply(result)
        return 0
    if args.json:
        emit_json({"run": run["run_id"], "model": run["model"], "backend": run["backend"],
                   "advice": [a.as_dict() for a in advice], "skipped_rules": skipped, "analyses": analyses})
        return 0
    _print(run, analyses, advice)
    return 0


def _print(run, analyses, advice) -> None:
    console.print(say("[bold]{}[/] on [bold]{}[/] (run {}): {} busy per step, {} ops", run["model"], run["backend"],
                      run["run_id"], _s(analyses["time"]["seconds"]), analyses["run"]["ops"]))
    if not advice:
        console.print("no advice: no rule fired for this run")
        return
    console.print(table("advice", ["#", "id", "severity", "estimated gain", "title"],
                        [[i + 1, a.id, a.severity, _gain(a), a.title] for i, a in enumerate(advice)]))
    for i, a in enumerate(advice):
        console.print(say("\n[bold]{}. {}[/]  [dim]({})[/]", i + 1, a.title, a.id))
        console.print(say("   {}", a.message))
        if a.apply:
            console.print(say("   [dim]measure it: opscope advise {} --apply {}[/]", run["run_id"], a.id))


def _print_apply(r) -> None:
    e, m = r["estimated"], r["measured"]
    colour = "green" if r["paid_off"] else "red"
    console.print(say("[bold]{}[/] -> new run [bold]{}[/] (parent {})", r["title"], r["run_id"], r["parent_run"]))
    console.print(table("estimated vs measured", ["", "estimated", "measured"], [
        ["gain per " + m["per"], _s(e["seconds"]), _s(m["seconds"])],
        ["fraction", f"{e['fraction']:.1%}", f"{m['fraction']:.1%}"],
        ["time per " + m["per"], _s(m["before_seconds"] - e["seconds"]), _s(m["after_seconds"])],
    ]))
    err = r["error"]
    console.print(f"numerical error vs the original configuration: max abs {err['max_abs']:.2e}, "
                  f"max rel {err['max_rel']:.2e}, cosine {err['cosine']:.6f}")
    console.print(say(f"[{colour}]{{}}[/]", r["verdict"]))


def _gain(a) -> str:
    g = a.estimated_gain
    return f"{_s(g['seconds'])} ({g['fraction']:.0%})" if g["seconds"] > 0 else "-"


def _s(seconds: float) -> str:
    return fmt_ns(seconds * 1e9)
