"""`opscope costmodel fit` / `check`: the learned cost model (runtime/cost_model.py), trained on the
measured ops and regions of every finished run in the store; `check` reports how well it predicts the
times of models it was not trained on (leave one model out, Spearman rank correlation)."""
from __future__ import annotations

from .common import add_json, console, emit_json, number_arg, output_path, say, table


TREES = number_arg("--trees", minimum=1, maximum=2000, whole=True)


def register(sub) -> None:
    p = sub.add_parser("costmodel", help="train the learned cost model on the run store; check it on unseen models")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    f = verbs.add_parser("fit", help="train on every finished run in the store and save it ($OPSCOPE_HOME)")
    f.add_argument("-o", "--output", default=None, help="where to save it (default $OPSCOPE_HOME/cost_model.json)")
    f.add_argument("--trees", type=TREES, default=60, help="boosting rounds")
    add_json(f)
    f.set_defaults(func=fit)
    c = verbs.add_parser("check", help="accuracy on held-out models: train on the others, rank-correlate each")
    c.add_argument("--trees", type=TREES, default=60, help="boosting rounds")
    add_json(c)
    c.set_defaults(func=check)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _data():
    from opscope.profiler.cost_data import collect
    from opscope.runtime.errors import UsageError
    ops, regions = collect()
    if not ops:
        raise UsageError("the run store holds no finished graph runs to learn from; profile some first "
                         "(e.g. `opscope profile demo:gpt -b onnxruntime`)")
    return ops, regions


def fit(args) -> int:
    from opscope.profiler.cost_data import fit as fit_model
    from opscope.runtime.cost_model import default_path
    trees = args.trees
    output_path(args.output)              # a missing folder, or a folder given as the file: one line, before the work
    ops, regions = _data()
    model = fit_model(ops, regions, trees=trees)
    path = args.output or default_path()
    model.save(path)
    out = {"path": str(path), "ops": len(ops), "regions": len(regions), "backends": model.backends,
           "models": model.trained_on, "region_overhead_ns": model.region_overhead_ns}
    if args.json:
        emit_json(out)
    else:
        console.print(say("cost model saved to {} from {} measured ops and {} regions of {} model(s) on {}",
                          str(path), len(ops), len(regions), len(model.trained_on), ", ".join(model.backends)))
    return 0


def _fmt(v: float) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def check(args) -> int:
    from opscope.profiler.cost_data import check as check_model
    trees = args.trees
    ops, regions = _data()
    out = check_model(ops, regions, trees=trees)
    if args.json:
        emit_json(out)
        return 0
    rows = [[m["model"], str(m["ops"]), _fmt(m["op_spearman"]), _fmt(m["naive_op_spearman"]), str(m["regions"]),
             _fmt(m["region_spearman"])] for m in out["models"]]
    rows.append(["all", str(out["ops"]), _fmt(out["op_spearman"]), _fmt(out["naive_op_spearman"]), str(out["regions"]),
                 _fmt(out["region_spearman"])])
    console.print(table("predicted vs measured on held-out models (Spearman)",
                        ["held-out model", "ops", "ops rank corr.", "naive", "regions", "regions rank corr."], rows))
    console.print(table("the same held-out ops by backend",
                        ["backend", "ops", "ops rank corr.", "naive"],
                        [[b["backend"], str(b["ops"]), _fmt(b["op_spearman"]), _fmt(b["naive_op_spearman"])]
                         for b in out["backends"]]))
    console.print(out["note"])
    return 0
