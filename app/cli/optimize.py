"""`opscope optimize MODEL -b B --cycles N [--suite FILE]`: baseline, then per cycle profile, apply the
applicable advice with the largest estimated gain (a pass), measure, keep it if it helped; write a plan."""
from __future__ import annotations

from pathlib import Path

from opscope.runtime.errors import UsageError

from .common import (add_json, add_model_and_backend, check_specs, console, count_arg, emit_json, fmt_bytes, output_path,
                     say, table)

HOST_MIN_GAIN = 0.02        # wall-clock runs must gain this fraction to count (run-to-run noise)


def register(sub) -> None:
    p = sub.add_parser("optimize", help="profile, apply the best advice, measure, repeat; keeps what helped")
    add_model_and_backend(p)
    p.add_argument("--cycles", type=count_arg("--cycles"), default=3,
                   help="at most this many apply-and-measure cycles")
    p.add_argument("--suite", metavar="FILE", help="a file listing model specs, one a line (# comments): "
                                                   "optimize each, MODEL is ignored")
    p.add_argument("--output", "-o", metavar="FILE.opsplan", help="the plan to write (default: "
                                                                   "$OPSCOPE_HOME/plans/MODEL.opsplan, beside the run store)")
    p.add_argument("--force", action="store_true", help="replace a plan file that already exists")
    p.add_argument("--steps", type=count_arg("--steps"), default=2, help="measured steps per configuration")
    add_json(p)
    # with --suite, MODEL is a placeholder the suite's specs replace: only the backend is checked before torch
    p.set_defaults(func=main, precheck=precheck)


def precheck(args) -> None:
    """Before torch is imported (app/cli/__init__.py): the specs, the suite file, the plan's folder."""
    check_specs(args, model=None if args.suite else "model")
    if args.suite:
        _suite(args.suite)
    output_path(args.output)


def main(args) -> int:
    from opscope.runtime import backends
    backends.resolve(args.backend)                       # a bad backend fails before any model loads
    specs = _suite(args.suite) if args.suite else [args.model]
    outs = [args.output if args.output and len(specs) == 1 else _default_plan(spec, args.output) for spec in specs]
    for out in outs:                                     # a plan the user compiled is never replaced unasked
        if Path(out).exists() and not args.force:
            raise UsageError(f"plan {out} already exists: give --force to replace it, or -o OTHER.opsplan")
    from opscope.app.progress import progress_bar, shown
    docs = []
    for spec, out in zip(specs, outs):
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        with progress_bar(f"optimizing {spec} on {args.backend}", total=args.cycles, unit="cycles",
                          show=shown(args)) as update:
            docs.append(optimize(spec, args.backend, cycles=args.cycles, steps=args.steps, output=out, tell=update))
    if args.json:
        emit_json(docs[0] if len(docs) == 1 else {"suite": args.suite, "models": docs})
        return 0
    for doc in docs:
        _print(doc)
    return 0


def _suite(path) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"suite file {path} does not exist: list model specs, one a line")
    specs = [ln.split("#", 1)[0].strip() for ln in p.read_text(errors="replace").splitlines()]
    specs = [s for s in specs if s]
    if not specs:
        raise UsageError(f"suite file {path} lists no models")
    return specs


def _default_plan(spec: str, folder) -> str:
    """Beside the run store (never the working folder, where a user's own MODEL.opsplan may be), or
    beside -o for a suite."""
    from opscope.runtime.home import opscope_home
    name = spec.replace("demo:", "").rsplit("/", 1)[-1].replace(".py:", "-").replace(":", "-")
    base = Path(folder).parent if folder else opscope_home() / "plans"
    return str(base / f"{name}.opsplan")


def optimize(model_spec: str, backend_spec: str, *, cycles: int, steps: int, output: str, tell=None) -> dict:
    """tell(done=cycles done, note=what now): for a progress bar."""
    tell = tell or (lambda **_: None)
    from opscope.profiler import RunStore, profile
    from opscope.profiler.advisor import analyses as _analyses
    from opscope.profiler.advisor.engine import evaluate
    from opscope.profiler.advisor.rules import load_rules
    from opscope.runtime import backends, models
    from opscope.runtime.capture import capture
    from opscope.runtime.passes import NAMES
    from opscope.runtime.passes.advice import backend_with_passes, estimate, measure, passes_for
    from opscope.runtime.passes.plan_file import compile_to_file
    from opscope.runtime.session import eager_outputs

    store = RunStore()
    tell(note="capturing")
    model, inputs = models.load(model_spec)
    backend = backends.resolve(backend_spec)
    graph = capture(model, inputs, name=model_spec)
    reference = eager_outputs(model, inputs)
    simulated = bool(getattr(backend.clock, "simulated", False))
    kept: list[str] = []
    tried: set = set()
    tell(note="measuring the baseline")
    base = measure(model, inputs, graph, backend, kept, steps=steps, reference=reference)
    best = base
    run_id = baseline_run = profile(model_spec, backend_spec, model=model, inputs=inputs, steps=1, store=store,
                                    config={"optimize": "baseline"})
    rows = []
    for cycle in range(1, cycles + 1):
        analyses = _analyses.analyze(_analyses.load(run_id, store))
        advice = evaluate(load_rules([]), analyses)
        candidates = {}
        for a in advice:                     # the advisor's applicable advice, as passes
            for name in passes_for(a.id) or []:
                if name not in kept and name not in tried and a.estimated_gain["seconds"] > 0:
                    candidates.setdefault(name, (a.estimated_gain["seconds"], a.id, "advisor"))
        per_op = best["step_seconds"] / max(best["nodes"], 1)
        for name in NAMES:                   # what the cost model expects of the passes the advisor cannot see
            if name not in kept and name not in tried and name not in candidates:
                gain = estimate(graph, backend, kept, name)
                gain = gain if simulated else gain * per_op
                if gain > 0:
                    candidates[name] = (gain, f"cost-model:{name}", "cost model")
        if not candidates:
            break
        name, (est, advice_id, source) = max(candidates.items(), key=lambda kv: kv[1][0])
        tried.add(name)
        tell(done=cycle - 1, note=f"cycle {cycle}: measuring {name}")
        trial = measure(model, inputs, graph, backend, kept + [name], steps=steps, reference=reference)
        gain = best["step_seconds"] - trial["step_seconds"]
        need = 0.0 if simulated else HOST_MIN_GAIN * best["step_seconds"]
        ok = gain > need and trial["max_abs_err"] <= max(1e-4, 10 * base["max_abs_err"])
        spec = backend_with_passes(backend_spec, kept + [name])
        run_id = profile(model_spec, spec, model=model, inputs=inputs, steps=1, store=store, parent_run=run_id,
                         config={"optimize": {"cycle": cycle, "pass": name, "advice": advice_id}})
        why = (f"{name} saved {gain * 1e6:.1f} us per step (estimated {est * 1e6:.1f} us, from the {source})" if ok else
               f"{name} did not help: {gain * 1e6:+.1f} us per step (estimated {est * 1e6:.1f} us)"
               + ("" if trial["max_abs_err"] <= max(1e-4, 10 * base["max_abs_err"]) else
                  f", and its error vs eager grew to {trial['max_abs_err']:.1e}"))
        rows.append({"cycle": cycle, "pass": name, "advice": advice_id, "source": source, "estimated_seconds": est,
                     "measured_seconds": gain, "kept": ok, "why": why, "run_id": run_id,
                     "step_seconds": trial["step_seconds"], "throughput": trial["throughput"],
                     "peak_bytes": trial["peak_bytes"], "max_abs_err": trial["max_abs_err"]})
        if ok:
            kept.append(name)
            best = trial
    kept = [n for n in NAMES if n in kept]
    tell(done=cycles, note="writing the plan")
    plan = compile_to_file(output, model_spec, backend_spec, passes=kept or "none")
    doc = {"model": model_spec, "backend": backend.name, "clock": "simulated" if simulated else "wall",
           "baseline": {k: base[k] for k in ("step_seconds", "throughput", "peak_bytes", "max_abs_err")},
           "final": {k: best[k] for k in ("step_seconds", "throughput", "peak_bytes", "max_abs_err")},
           "passes": kept, "cycles": rows, "plan": output, "plan_nodes": plan["nodes"], "run_id": baseline_run,
           "speedup": base["step_seconds"] / best["step_seconds"] if best["step_seconds"] > 0 else 1.0}
    store.update_run(baseline_run, config={"optimize": {"cycles": rows, "baseline": doc["baseline"],
                                                        "final": doc["final"], "passes": kept, "plan": output}})
    return doc


def _print(doc) -> None:
    b, f = doc["baseline"], doc["final"]
    console.print(say("[bold]{}[/] on [bold]{}[/] ({} clock): step {:.3f} -> {:.3f} ms ({:.2f}x), peak {} -> {}, "
                      "passes kept: {}; plan {} (run {})", doc["model"], doc["backend"], doc["clock"],
                      b["step_seconds"] * 1e3, f["step_seconds"] * 1e3, doc["speedup"], fmt_bytes(b["peak_bytes"]),
                      fmt_bytes(f["peak_bytes"]), ", ".join(doc["passes"]) or "none", doc["plan"], doc["run_id"]))
    console.print(table("cycles", ["cycle", "pass", "from", "estimated", "measured", "kept", "step", "peak", "err vs eager"],
                        [[r["cycle"], r["pass"], r["advice"], f"{r['estimated_seconds'] * 1e6:.1f} us",
                          f"{r['measured_seconds'] * 1e6:+.1f} us", "yes" if r["kept"] else "no",
                          f"{r['step_seconds'] * 1e3:.3f} ms", fmt_bytes(r["peak_bytes"]), f"{r['max_abs_err']:.1e}"]
                         for r in doc["cycles"]],
                        justify_right={"estimated", "measured", "step", "peak"}))
