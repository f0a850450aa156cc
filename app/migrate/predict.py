"""`opscope migrate check`: predict, per op and per source line, how a model runs on each backend,
then confirm the prediction with a short real run. With `train`, the graph is a whole training step
(forward, loss, backward, optimizer update) and the run is one step, its loss compared with eager's.

A prediction asks each backend's operator registry (the same `supports(node)` placement asks, through
the backend's fallback chain):
    native       the backend runs the op
    fallback     the backend refuses it and a fallback runs it (with transfers around it)
    missing-op   opscope has no op for it yet, so backends built on opscope's kernels (numpy, sim) cannot
                 run it; torch backends still can. Work for opscope, not a limit of the chip
    unsupported  the backend (its description) and its fallbacks refuse it: the model does not run there
The confirming run executes the plan with a hook that records which backend each op really
ran on, and compares the outputs with eager PyTorch. When ops are unsupported, the run is
expected to be refused with exactly those ops.
"""
from __future__ import annotations

from opscope.runtime import models, open_session
from opscope.runtime.backends import resolve
from opscope.runtime.capture import capture
from opscope.runtime.errors import OpscopeError, UnsupportedOpError
from opscope.runtime.ops import OPS
from opscope.runtime.placement import choose
from opscope.runtime.session import compare

RANK = {"native": 0, "fallback": 1, "missing-op": 2, "unsupported": 3}
COSINE_OK = 0.9999
LOSS_TOL = 1e-4               # a training step's loss vs eager's, relative to max(1, |loss|)


def predict_node(node, backend) -> tuple[str, str, str]:
    """(status, backend that runs it, why it is not native)."""
    target, refused = choose(node, backend, backend.fallback_chain())
    why = str(refused.get(backend.name, ""))
    if target is backend:
        return "native", backend.name, ""
    if target is not None:
        return "fallback", target.name, why
    others = "; ".join(f"fallback {n} cannot run it either ({r})" for n, r in refused.items() if n != backend.name)
    status = "unsupported" if node.op in OPS else "missing-op"
    return status, "", why + (f"; {others}" if others else "")


def _predict(graph, backend) -> dict[str, tuple]:
    return {n.name: (n, *predict_node(n, backend)) for n in graph.nodes if n.op != "transfer"}


def _by_op(pred: dict) -> list[dict]:
    ops: dict[str, dict] = {}
    for node, status, where, why in pred.values():
        o = ops.setdefault(node.op, {"op": node.op, "nodes": 0, "status": status, "runs_on": where, "reason": why})
        o["nodes"] += 1
        if RANK[status] > RANK[o["status"]]:
            o.update(status=status, runs_on=where, reason=why)
    return sorted(ops.values(), key=lambda o: (-RANK[o["status"]], o["op"]))


def _by_line(pred: dict) -> list[dict]:
    lines: dict[str, dict] = {}
    for node, status, _, _ in pred.values():
        key = node.source or "(no source line)"
        d = lines.setdefault(key, {"source": key, "code": node.source_line or "", "status": status, "ops": []})
        if node.op not in d["ops"]:
            d["ops"].append(node.op)
        if RANK[status] > RANK[d["status"]]:
            d["status"] = status
    return sorted(lines.values(), key=lambda d: (-RANK[d["status"]], d["source"]))


class _Where:
    """Executor hook: which backend each op really ran on, and for how long on that backend's clock."""

    def __init__(self):
        self.ran: dict[str, str] = {}
        self.seconds: dict[str, float] = {}
        self.clocks: dict[str, str] = {}

    def after_op(self, call) -> None:
        if call.node.op != "transfer":
            self.ran[call.node.name] = call.backend.name
            self.seconds[call.node.name] = max(0, call.end_ns - call.start_ns) / 1e9
            self.clocks[call.backend.name] = "simulated" if getattr(call.backend.clock, "simulated", False) \
                else "host wall"


def _times(pred: dict, hook: _Where, backends: dict) -> list[dict]:
    """Per op: the roofline estimate on the backend predicted to run it (its description's numbers) beside the time
    the confirming run measured there, each labelled with its clock. For a sim chip the two use the same model
    (the sim clock is the roofline), so agreement there checks placement and shapes, not the chip."""
    from opscope.runtime.roofline import node_seconds
    ops: dict[tuple, dict] = {}
    for name, (node, status, where, _) in pred.items():
        b = backends.get(where)
        if b is None or name not in hook.seconds:
            continue
        o = ops.setdefault((node.op, where), {"op": node.op, "backend": where, "nodes": 0, "predicted_seconds": 0.0,
                                             "measured_seconds": 0.0, "predicted_clock": "estimate: roofline",
                                             "measured_clock": hook.clocks.get(where, "host wall")})
        o["nodes"] += 1
        o["predicted_seconds"] += node_seconds(node, b.description)
        o["measured_seconds"] += hook.seconds[name]
    for o in ops.values():
        o["ratio"] = o["measured_seconds"] / o["predicted_seconds"] if o["predicted_seconds"] > 0 else None
    return sorted(ops.values(), key=lambda o: -o["measured_seconds"])


def _backends_of(backend) -> dict:
    return {b.name: b for b in [backend, *backend.fallback_chain()]}


def why_not(doc: dict) -> str:
    """One line: why `migrate check` did not confirm its prediction ('' when it did)."""
    reasons = []
    for b in doc["backends"]:
        run = b["run"]
        if run.get("error") and run.get("ran"):
            reasons.append(f"{b['backend']}: the run failed: {run['error']}")
        elif not run["matched"]:
            n = len(run.get("mismatches") or [])
            reasons.append(f"{b['backend']}: placement did not match the prediction"
                           + (f" ({n} op{'s' if n != 1 else ''} ran elsewhere)" if n else ""))
        elif not run.get("numerics_ok", True):
            if doc.get("train"):
                reasons.append(f"{b['backend']}: the loss {run['loss']:.6g} differs from eager's "
                               f"{run['eager_loss']:.6g} by {run['max_abs_err']:.2e}, beyond the tolerance "
                               f"{LOSS_TOL:g} (relative to max(1, |loss|))")
            else:
                reasons.append(f"{b['backend']}: outputs differ from eager PyTorch (cosine {run['cosine']:.6f} < "
                               f"{COSINE_OK})")
    return "; ".join(reasons)


def check_backend(model_spec: str, backend_spec: str, model, inputs) -> dict:
    backend = resolve(backend_spec)            # a bad spec is a usage error before any work
    doc = {"backend": backend.name, "fallback": backend.fallback.name if backend.fallback else None,
           "fallbacks": [b.name for b in backend.fallbacks]}
    run: dict = {"ran": False, "matched": False, "error": None}
    try:
        session = open_session(model_spec, backend_spec, model=model, inputs=inputs)
    except UnsupportedOpError as e:
        pred = _predict(capture(model, inputs, name=model_spec), backend)
        expected = sorted({n.op for n, s, _, _ in pred.values() if s in ("unsupported", "missing-op")})
        run.update(error=str(e), refused_ops=sorted(e.ops), matched=sorted(e.ops) == expected)
        if not run["matched"]:
            run["mismatches"] = [{"expected_unsupported": expected, "refused": sorted(e.ops)}]
    else:
        pred = _predict(session.graph, session.backend)
        hook = _Where()
        try:
            with session.executor.hooked(hook):
                out = session.run_host()
            err = compare(out, session.eager())
        except OpscopeError as e:
            run.update(ran=True, error=str(e))
        else:
            mism = [{"node": name, "op": node.op, "predicted": where, "ran_on": hook.ran.get(name)}
                    for name, (node, status, where, _) in pred.items() if hook.ran.get(name) != where]
            run.update(ran=True, matched=not mism, mismatches=mism[:20], max_abs_err=err["max_abs"],
                       max_rel_err=err["max_rel"], cosine=err["cosine"], numerics_ok=err["cosine"] >= COSINE_OK,
                       times=_times(pred, hook, _backends_of(session.backend)))
    counts = {s: 0 for s in RANK}
    for _, status, _, _ in pred.values():
        counts[status] += 1
    doc.update(counts=counts, ops=_by_op(pred), lines=_by_line(pred), run=run)
    return doc


def check_train_backend(model_spec: str, backend_spec: str, model, inputs, eager_loss: float) -> dict:
    """The same for one training step (forward, loss, backward, SGD update): predicted per op of the joint
    graph, confirmed by running the step and comparing its loss with eager PyTorch's."""
    from opscope.runtime.train import OptimizerSpec, Trainer, build_train_graph, capture_joint
    backend = resolve(backend_spec)
    doc = {"backend": backend.name, "fallback": backend.fallback.name if backend.fallback else None,
           "fallbacks": [b.name for b in backend.fallbacks]}
    run: dict = {"ran": False, "matched": False, "error": None}
    train = build_train_graph(capture_joint(model, inputs, model_spec), OptimizerSpec("sgd", lr=1e-3))
    pred = _predict(train.graph, backend)
    try:
        trainer = Trainer(train, backend, inputs)
    except UnsupportedOpError as e:
        expected = sorted({n.op for n, s, _, _ in pred.values() if s in ("unsupported", "missing-op")})
        run.update(error=str(e), refused_ops=sorted(e.ops), matched=sorted(e.ops) == expected)
    else:
        hook = _Where()
        try:
            with trainer.executor.hooked(hook):
                loss = trainer.step()
        except OpscopeError as e:
            run.update(ran=True, error=str(e))
        else:
            mism = [{"node": name, "op": node.op, "predicted": where, "ran_on": hook.ran.get(name)}
                    for name, (node, status, where, _) in pred.items() if hook.ran.get(name) != where]
            err = abs(loss - eager_loss)
            run.update(ran=True, matched=not mism, mismatches=mism[:20], loss=loss, eager_loss=eager_loss,
                       max_abs_err=err, numerics_ok=err <= LOSS_TOL * max(1.0, abs(eager_loss)),
                       times=_times(pred, hook, _backends_of(backend)))
    counts = {s: 0 for s in RANK}
    phases: dict[str, dict] = {}
    for node, status, _, _ in pred.values():
        counts[status] += 1
        ph = phases.setdefault(node.attrs.get("phase", "forward"), {s: 0 for s in RANK})
        ph[status] += 1
    doc.update(counts=counts, phases=phases, ops=_by_op(pred), lines=_by_line(pred), run=run)
    return doc


def check(model_spec: str, backend_specs: list[str], *, train: bool = False) -> dict:
    for spec in backend_specs:
        resolve(spec)                          # every spec checked before the model loads
    if train:
        from opscope.runtime.train import loss_of
        model, inputs = models.load_train(model_spec)
        import copy

        import torch
        with torch.no_grad():          # on a copy: a training-mode forward updates batch-norm statistics
            eager_loss = float(loss_of(copy.deepcopy(model)(*inputs), model_spec))
        results = [check_train_backend(model_spec, spec, model, inputs, eager_loss) for spec in backend_specs]
    else:
        model, inputs = models.load(model_spec)
        results = [check_backend(model_spec, spec, model, inputs) for spec in backend_specs]
    doc = {"model": model_spec, "train": train, "backends": results,
           "confirmed": all(r["run"]["matched"] and r["run"].get("numerics_ok", True) for r in results)}
    doc["why_not"] = why_not(doc)
    return doc
