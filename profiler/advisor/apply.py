"""Apply and verify: re-run a model with one piece of advice applied, record the new run (its
parent is the run the advice came from), and report the estimated gain next to the measured one
and the numerical error the change introduced.

    result = apply_advice(run_id, "reduced-precision")
    result["measured"]["fraction"], result["error"]["max_rel"], result["paid_off"]

A hybrid training run (`opscope train MODEL --hybrid A=0.7,B=0.3`, its report in `config["dist"]`) takes
the `ratios` change (or a `backend` change to `hybrid:A=..,B=..`): `train --hybrid` runs again with the
new shares, and the step time it measures stands next to the one the advice expected.
"""
from __future__ import annotations

import copy
import hashlib
import json
import subprocess
from pathlib import Path

import numpy as np
import torch

from opscope.runtime import backends, models, open_session
from opscope.runtime import registry
from opscope.runtime.child import python_command, start
from opscope.runtime.dtypes import to_torch
from opscope.runtime.errors import UsageError
from opscope.runtime.home import opscope_home
from opscope.runtime.session import compare

from . import analyses as _analyses
from .engine import Advice

# a change that gains less than this (of the step) is within run-to-run noise: it did not pay off
PAYOFF_FRACTION = 0.02


def find_advice(advice: list[Advice], wanted: str) -> Advice:
    """An advice id (`implement-fallback-op:gelu`), or a rule id that names exactly one piece of advice."""
    exact = [a for a in advice if a.id == wanted]
    if exact:
        return exact[0]
    by_rule = [a for a in advice if wanted and (a.rule == wanted or a.id.startswith(wanted))]
    if len(by_rule) == 1:
        return by_rule[0]
    known = ", ".join(a.id for a in advice) or "none"
    if by_rule:
        raise UsageError(f"advice id {wanted!r} is ambiguous ({', '.join(a.id for a in by_rule)}): give the full id")
    raise UsageError(f"no advice {wanted!r} for this run; its advice ids are: {known}")


def apply_advice(run_id: str, advice_id: str, *, store=None, advice: list[Advice] | None = None,
                 rules: list | None = None, analyses: dict | None = None) -> dict:
    """`advice` and `analyses`: the run's, when the caller has them already (`report`); else made here."""
    from opscope.profiler import profile
    from opscope.profiler.store import RunStore

    from .engine import evaluate
    from .rules import load_rules
    store = store or RunStore()
    run = store.get_run(run_id)
    if analyses is None:
        analyses = _analyses.analyze(_analyses.load(run["run_id"], store))
    if advice is None:
        advice = evaluate(load_rules(rules or []), analyses)
    a = find_advice(advice, advice_id)
    if not a.apply:
        raise UsageError(f"advice {a.id} cannot be applied automatically (it needs a change to the model or the "
                         "backend itself); its message says what to do")
    change = dict(a.apply)
    if _is_ratios(change):
        return _apply_ratios(run, a, change, store, analyses)
    spec = backend_spec(run)
    model, inputs = _load_model(run)
    new_model, new_inputs, new_spec, factor = _changed(change, model, inputs, spec)

    before = analyses["time"]["seconds"]
    new_id = profile(run["model"], new_spec, model=new_model, inputs=new_inputs, steps=int(run.get("steps") or 1),
                     warmup=int(run.get("warmup") or 0), store=store, parent_run=run["run_id"],
                     allow_fallback=True, config={"advice": a.id, "change": change, "backend_spec": new_spec})
    new_run = store.get_run(new_id)
    if new_run.get("status") != "ok":
        raise UsageError(f"the run with {a.id} applied failed: {new_run.get('error')}")
    after = _analyses.analyze(_analyses.load(new_id, store))["time"]["seconds"] / factor
    error = _error(spec, model, inputs, new_spec, new_model, new_inputs, factor)

    gain = before - after
    fraction = gain / before if before > 0 else 0.0
    paid = fraction >= PAYOFF_FRACTION
    result = {
        "run_id": new_id, "parent_run": run["run_id"], "advice": a.id, "title": a.title, "change": change,
        "backend": new_spec, "estimated": a.estimated_gain,
        "measured": {"before_seconds": before, "after_seconds": after, "seconds": gain, "fraction": fraction,
                     "per": "original batch" if factor != 1 else "step"},
        "error": error, "paid_off": paid,
        "verdict": (f"paid off: {fraction:.1%} faster (estimated {a.estimated_gain['fraction']:.1%})" if paid else
                    f"did not pay off: {fraction:+.1%} measured vs {a.estimated_gain['fraction']:.1%} estimated"),
    }
    store.add_artifact(new_id, "advice", a.id, json.dumps(result, default=str).encode())
    store.update_run(new_id, config={"verification": {k: result[k] for k in ("measured", "error", "paid_off")}})
    return result


def backend_spec(run: dict) -> str:
    """A backend spec that rebuilds the backend the run used: its recorded spec, its name when that
    still resolves to the same description, else the recorded description written out as a file."""
    cfg = run.get("config") or {}
    if isinstance(cfg, dict) and cfg.get("backend_spec"):
        return cfg["backend_spec"]
    desc = _analyses.description_of(run)
    name = run.get("backend") or ""
    try:
        b = backends.resolve(name)
        own = registry.get(desc.implementation) if desc is not None else None
        if desc is None or b.description.digest == desc.digest or (own is not None and own.host_kernels):
            return name
    except UsageError:
        pass
    if desc is None:
        raise UsageError(f"run {run['run_id']} does not record its backend description; profile it again")
    return str(write_description(desc))


def write_description(desc) -> Path:
    """The recorded description as a .toml under $OPSCOPE_HOME/advisor/ (what `--apply` re-runs on)."""
    b = {"name": desc.name, "implementation": desc.implementation}
    for k in ("fallback", "device", "summary"):
        if getattr(desc, k):
            b[k] = getattr(desc, k)
    hw = {"kind": desc.kind, "preferred_layout": desc.preferred_layout}
    for k in ("peak_flops", "memory_bandwidth", "memory_capacity", "launch_overhead", "host_bandwidth", "cores"):
        v = getattr(desc, k)
        if v:
            hw[k] = v
    ops = {}
    if desc.supported is not None:
        ops["supported"] = list(desc.supported)
    elif desc.unsupported:
        ops["unsupported"] = list(desc.unsupported)
    if desc.low_precision:
        ops["low_precision"] = list(desc.low_precision)
    sections = {"backend": b, "hardware": hw, "operators": ops, "tuning": dict(desc.tuning or {})}
    text = "".join(f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in body.items()) + "\n"
                   for name, body in sections.items() if body)
    folder = opscope_home() / "advisor" / "backends"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{desc.name}-{hashlib.sha256(text.encode()).hexdigest()[:10]}.toml"
    path.write_text(text)
    return path


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {v!r} to TOML")


def _load_model(run: dict):
    spec = run.get("model") or ""
    try:
        return models.load(spec)
    except UsageError as e:
        raise UsageError(f"cannot re-run model {spec!r} of run {run['run_id']}: {e}") from None


def _changed(change: dict, model, inputs, spec):
    kind = change.get("kind")
    if kind == "dtype":
        dtype = change.get("dtype") or "float16"
        try:
            tdt = to_torch(dtype)
        except (KeyError, TypeError):
            raise UsageError(f"advice asks for dtype {dtype!r}, which opscope does not know") from None
        m = copy.deepcopy(model).to(tdt)
        ins = tuple(x.to(tdt) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
        return m, ins, spec, 1
    if kind == "backend":
        target = change.get("backend") or ""
        backends.resolve(target)                     # a bad spec fails here, with its own message
        return model, inputs, target, 1
    if kind == "batch":
        try:
            factor = int(change.get("factor") or 2)
        except ValueError:
            factor = 0
        if factor < 1:
            raise UsageError(f"advice asks for batch factor {change.get('factor')!r}: expected a positive integer")
        ins = tuple(torch.cat([x] * factor, dim=0) if isinstance(x, torch.Tensor) and x.dim() > 0 else x
                    for x in inputs)
        return model, ins, spec, factor
    if kind == "passes":                              # middle-layer advice: the same backend with passes on
        from opscope.runtime.passes.advice import backend_with_passes
        wanted = [n.strip() for n in str(change.get("passes") or "").split(",") if n.strip()]
        if not wanted:
            raise UsageError("advice asks for passes but names none (apply = { kind = \"passes\", passes = \"fuse\" })")
        on = [n for n, v in backends.resolve(spec).description.passes.items() if v]   # keep what is already on
        return model, inputs, backend_with_passes(spec, list(dict.fromkeys(on + wanted))), 1
    raise UsageError(f"advice change {kind!r} cannot be applied; known changes are dtype, backend, batch, passes, "
                     "ratios")


def _error(spec, model, inputs, new_spec, new_model, new_inputs, factor) -> dict:
    """Outputs of the changed configuration vs the original one (the original batch's rows when batched)."""
    ref = open_session("original", spec, model=model, inputs=inputs).run_host()
    out = open_session("changed", new_spec, model=new_model, inputs=new_inputs).run_host()
    if factor != 1:
        out = [np.asarray(o)[: np.asarray(r).shape[0]] if np.ndim(o) else o for o, r in zip(out, ref)]
    return compare([np.asarray(o, dtype=np.float64) for o in out], [np.asarray(r, dtype=np.float64) for r in ref])


# --- hybrid runs: new ratios -----------------------------------------------------------------------------
def _is_ratios(change: dict) -> bool:
    return change.get("kind") == "ratios" or (change.get("kind") == "backend" and
                                              str(change.get("backend") or "").startswith("hybrid:"))


def _apply_ratios(run: dict, a: Advice, change: dict, store, analyses: dict) -> dict:
    """Train again with the new shares (same model, steps, optimizer), then compare the step time the
    advice expected with the one measured; the losses of both runs are the numerical check (data-parallel
    training computes the full batch's loss whatever the split)."""
    from opscope.runtime.session import compare
    cfg = run.get("config") if isinstance(run.get("config"), dict) else {}
    dist = cfg.get("dist") if isinstance(cfg.get("dist"), dict) else None
    if dist is None:
        raise UsageError(f"advice {a.id} changes the ratios of a hybrid run; run {run['run_id']} is not one "
                         "(train with `opscope train MODEL --hybrid A=0.5,B=0.5` to apply it)")
    hybrid = str(change.get("hybrid") or change.get("ratios") or change.get("backend") or "")
    hybrid = hybrid[len("hybrid:"):] if hybrid.startswith("hybrid:") else hybrid
    if not hybrid:
        raise UsageError(f"advice {a.id} gives no ratios to apply")
    opt = dist.get("optimizer") or {}
    steps = max(len(dist.get("steps") or []), int(dist.get("steps_requested") or 1))
    cmd = ["train", run["model"], "--hybrid", hybrid, "--steps", str(steps), "--optimizer",
           str(opt.get("name") or "sgd"), "--json"]
    if opt.get("lr") is not None:
        cmd += ["--lr", repr(float(opt["lr"]))]
    proc = start(python_command("opscope.app", *cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate()
    except BaseException:                 # Ctrl-C: the retraining ends with us
        proc.kill()
        proc.wait()
        raise
    p = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    try:
        report = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else None
    except ValueError:
        report = None
    if p.returncode != 0 or not report or not report.get("run_id"):
        why = (p.stderr.strip().splitlines() or ["no report"])[-1]
        raise UsageError(f"the run with {a.id} applied ({hybrid}) failed: {why}")
    new_id = report["run_id"]
    store.update_run(new_id, parent_run=run["run_id"])
    new = _analyses.analyze(_analyses.load(new_id, store))["ranks"]
    before, expected = analyses["ranks"]["step_seconds"], analyses["ranks"]["expected_step_seconds"]
    after = new["step_seconds"]
    gain = before - after
    fraction = gain / before if before > 0 else 0.0
    paid = fraction >= PAYOFF_FRACTION
    old_losses, new_losses = dist.get("losses") or [], report.get("losses") or []
    n = min(len(old_losses), len(new_losses))
    error = compare([np.asarray(new_losses[:n], dtype=np.float64)], [np.asarray(old_losses[:n], dtype=np.float64)])
    estimated = dict(a.estimated_gain)
    result = {
        "run_id": new_id, "parent_run": run["run_id"], "advice": a.id, "title": a.title, "change": change,
        "backend": f"hybrid:{hybrid}", "estimated": estimated,
        "step_seconds": {"before": before, "estimated": expected, "measured": after,
                         "estimate_error": (after - expected) / expected if expected > 0 else 0.0},
        "measured": {"before_seconds": before, "after_seconds": after, "seconds": gain, "fraction": fraction,
                     "per": "step"},
        "ratios": {"before": analyses["ranks"]["ratios"], "after": [s["ratios"] for s in report["steps"][-1:]][0]
                   if report.get("steps") else []},
        "error": error, "paid_off": paid,
        "verdict": (f"paid off: step {before * 1e3:.2f} ms -> {after * 1e3:.2f} ms measured "
                    f"({expected * 1e3:.2f} ms estimated)" if paid else
                    f"did not pay off: step {before * 1e3:.2f} ms -> {after * 1e3:.2f} ms measured "
                    f"({expected * 1e3:.2f} ms estimated)"),
    }
    store.add_artifact(new_id, "advice", a.id, json.dumps(result, default=str).encode())
    store.update_run(new_id, config={"verification": {k: result[k] for k in ("measured", "error", "paid_off",
                                                                              "step_seconds")}})
    return result
