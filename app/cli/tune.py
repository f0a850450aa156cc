"""`opscope tune MODEL --backend B [--budget N] [--json]`: search a backend's knobs, measure each
trial, keep the best configuration in the tuning cache."""
from __future__ import annotations

from .common import add_json, add_model_and_backend, console, count_arg, emit_json, fmt_ns, fmt_ratio, say, table


def register(sub) -> None:
    p = sub.add_parser("tune", help="search a backend's knobs (threads, dtype, batch chunking) and cache the best")
    add_model_and_backend(p)
    p.add_argument("--budget", type=count_arg("--budget"), default=8,
                   help="trials to measure, the default configuration included")
    p.add_argument("--repeats", type=count_arg("--repeats"), default=3, help="timed runs per trial (the median counts)")
    p.add_argument("--no-cache", action="store_true",
                   help="measure even when the cache has an answer (a worse result never replaces a better cached one)")
    p.add_argument("--accept-precision-loss", action="store_true",
                   help="adopt the fastest configuration even when it changes the outputs (max abs err vs the "
                        "default's over 1e-4: a lower dtype); without it such a winner is shown, not adopted")
    p.add_argument("--search", choices=("bandit", "tpe", "random"), default="bandit",
                   help="how the next configuration is chosen: bandit (a learning agent: Thompson sampling over "
                        "each knob's effect), tpe (Optuna's TPE) or random")
    p.add_argument("--passes", action="store_true",
                   help="also search opscope's graph passes (dce, fold, cse, layout, fuse, memplan), each on or off")
    add_json(p)
    p.set_defaults(func=main)


def main(args) -> int:
    from opscope.app.progress import progress_bar, shown
    from opscope.profiler.tune import tune

    with progress_bar(f"tuning {args.model} on {args.backend}", total=max(args.budget, 1), unit="trials",
                      show=shown(args)) as update:
        def progress(done, total, trial):
            secs = fmt_ns(trial["seconds"] * 1e9) if trial.get("seconds") is not None else trial["status"]
            update(done=done, total=total, note=f"trial {done}: {secs}")

        result = tune(args.model, args.backend, budget=args.budget, repeats=args.repeats,
                      use_cache=not args.no_cache, progress=progress,
                      accept_precision_loss=args.accept_precision_loss, search=args.search, passes=args.passes)
    if args.json:
        emit_json(result)
        return 0
    how = "from the tuning cache (no trials run)" if result["cache_hit"] else f"{result['trials_run']} trials"
    console.print(say("[bold]{}[/] on [bold]{}[/]: {}", args.model, result["backend"], how))
    if result["trials"]:
        console.print(table("trials", ["#", "config", "time", "status"],
                            [[t["number"], _cfg(t["config"]), fmt_ns(t["seconds"] * 1e9) if t["seconds"] else "-",
                              t["status"]] for t in result["trials"]], justify_right={"time"}))
    d, b = result["default"], result["best"]
    console.print(say("default {}: {}", _cfg(d["config"]), fmt_ns(d["seconds"] * 1e9)))
    console.print(say("[green]best    {}: {} ({})[/]", _cfg(b["config"]), fmt_ns(b["seconds"] * 1e9),
                      fmt_ratio(result["speedup"])))
    e = b.get("error")
    if e:                                   # what the speed costs in accuracy (bfloat16 is not free)
        console.print(f"        outputs vs the default's: max abs err {e['max_abs']:.2e}, cosine {e['cosine']:.6f}")
    if result.get("note"):
        console.print(say("[yellow]{}[/]", result["note"]))
    if not result.get("kept_cached") and (result["cache_hit"] or result["speedup"] > 1.0):
        console.print("`opscope run` and `opscope profile` use the best configuration and say so "
                      "(--no-tune to opt out)")
    return 0


def _cfg(c: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in c.items())
