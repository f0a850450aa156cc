"""`opscope train MODEL --backend B --steps N`: train on a backend and in eager PyTorch side by side."""
from __future__ import annotations

from .common import (OPTIMIZERS, add_fallback, add_json, add_model_and_backend, choice_arg, console, count_arg,
                     emit_json, fallback_of, fmt_bytes, number_arg, say, table)

TOLERANCE = 1e-4      # loss per step and every parameter after the last step (float32)


def register(sub) -> None:
    p = sub.add_parser("train", help="run N training steps on a backend and compare with eager PyTorch")
    add_model_and_backend(p)
    p.add_argument("--steps", type=count_arg("--steps"), default=10, help="training steps (default 10)")
    p.add_argument("--optimizer", default="sgd", type=choice_arg("optimizer", OPTIMIZERS), metavar="sgd|adamw",
                   help="optimizer (default sgd, momentum 0.9)")
    p.add_argument("--lr", type=number_arg("--lr", above=0), default=None,
                   help="learning rate (default 1e-2 for sgd, 1e-3 for adamw)")
    add_fallback(p)
    from opscope.app.hybrid import add_hybrid_arguments
    add_hybrid_arguments(p)
    add_json(p)
    p.set_defaults(func=main)


def main(args) -> int:
    if args.hybrid:                      # data-parallel over several backends, one process per share
        from opscope.app.hybrid import train_hybrid
        return train_hybrid(args)
    from opscope.app.hybrid import refuse_without_hybrid
    refuse_without_hybrid(args)
    from opscope.runtime.train import DEFAULT_LR, OptimizerSpec, compare_with_eager

    from opscope.app.progress import progress_bar, shown
    opt = OptimizerSpec(args.optimizer, lr=args.lr if args.lr is not None else DEFAULT_LR.get(args.optimizer, 1e-2))
    with progress_bar(f"training {args.model}", total=args.steps, unit="steps", show=shown(args)) as update:
        r = compare_with_eager(args.model, args.backend, steps=args.steps, optimizer=opt,
                               allow_fallback=fallback_of(args),
                               progress=lambda where, done: update(done=done, note=where))
    loss_ok = all(abs(a - e) <= TOLERANCE * max(1.0, abs(e)) for a, e in zip(r["losses"], r["eager_losses"]))
    r["within_tolerance"] = bool(loss_ok and r["parameter_error"]["max_abs"] <= TOLERANCE)
    r["tolerance"] = TOLERANCE
    if args.json:
        emit_json(r)
        return 0
    rep = r["placement"]
    console.print(say("[bold]{}[/] trained {} steps on [bold]{}[/] with {} (lr {:g}): {} ops per step ({})", args.model,
                      r["steps"], r["backend"], opt.name, opt.lr, r["nodes"],
                      ", ".join(f"{n} {p}" for p, n in r["phases"].items())))
    console.print(table("loss per step", ["step", r["backend"], "eager PyTorch", "abs err"],
                        [[i + 1, f"{a:.6f}", f"{e:.6f}", f"{abs(a - e):.1e}"]
                         for i, (a, e) in enumerate(zip(r["losses"], r["eager_losses"]))],
                        justify_right={"step", r["backend"], "eager PyTorch", "abs err"}))
    worst = sorted(r["parameters"].items(), key=lambda kv: -kv[1]["max_abs"])[:5]
    console.print(f"after step {r['steps']}: loss max abs err {r['loss_error']['max_abs']:.2e} (rel "
                  f"{r['loss_error']['max_rel']:.2e}); parameters max abs err {r['parameter_error']['max_abs']:.2e} "
                  f"(rel {r['parameter_error']['max_rel']:.2e}) over {len(r['parameters'])} tensors -- "
                  + ("[green]within[/]" if r["within_tolerance"] else "[red]outside[/]") + f" {TOLERANCE:g}")
    console.print(table("largest parameter errors", ["parameter", "max abs", "max rel"],
                        [[n, f"{e['max_abs']:.2e}", f"{e['max_rel']:.2e}"] for n, e in worst]))
    mem = r["memory"]
    if r["clock"] == "simulated":      # the chip's step (what run, profile and optimize report) beside the host's
        console.print(say("time per step: {:.3f} ms simulated on {} (the chip's clock; {:.1f} ms host wall), "
                          "{:.1f} ms host wall eager (medians); capture {:.1f} s wall", r["step_ns"] / 1e6,
                          r["backend"], r["step_seconds"] * 1e3, r["eager_step_seconds"] * 1e3, r["capture_seconds"]))
    else:
        console.print(say("time per step: {:.1f} ms host wall on {}, {:.1f} ms host wall eager (medians); "
                          "capture {:.1f} s wall", r["step_seconds"] * 1e3, r["backend"], r["eager_step_seconds"] * 1e3,
                          r["capture_seconds"]))
    console.print(say("memory: {}", ", ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in mem.items())))
    console.print(table("placement", ["backend", "nodes"], [[b, n] for b, n in rep["nodes_per_backend"].items()],
                        justify_right={"nodes"}))
    if rep["fallback_ops"]:
        console.print(table("fell back", ["op", "nodes", "to", "why"],
                            [[f["op"], f["nodes"], f["backend"], f["reason"]] for f in rep["fallback_ops"]]))
    console.print(f"{rep['transfers']} transfers, {fmt_bytes(rep['transfer_bytes'])} moved between backends per step")
    return 0
