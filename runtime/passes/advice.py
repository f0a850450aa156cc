"""Advice that applies: which pass carries out which piece of advice, a backend spec with passes
switched on, and a measurement of a plan (step time on the backend's clock, peak, error vs eager).

    passes_for("fuse-elementwise:...")            -> ["fuse"]
    spec = backend_with_passes("sim:npu-a1", ["fuse"])     # a description file with [passes] fuse = true
    measure(model, inputs, graph, backend, ["fuse"])      -> {"step_seconds", "peak_bytes", "max_abs_err", ...}

The advisor's `--apply` re-profiles on `spec`: compile_plan runs the passes a description switches on.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

# advisor rule id -> the passes that carry it out
ADVICE_PASSES = {"fuse-elementwise": ["fuse"], "npu-conv-layout": ["layout"], "gpu-conv-layout": ["layout"],
                 "checkpoint-activations": ["memplan"]}


def passes_for(advice_id: str) -> list[str] | None:
    rule = advice_id.split(":", 1)[0]
    return list(ADVICE_PASSES[rule]) if rule in ADVICE_PASSES else None


def backend_with_passes(spec: str, names) -> str:
    """A description file: the backend of `spec` with exactly `names` switched on in its [passes]
    table, under $OPSCOPE_HOME/passes/ (same backend name, so runs compare side by side)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    from .. import backends
    from ..home import opscope_home
    from . import pass_names
    from .catalog import NAMES
    on = set(pass_names(list(names)))
    desc = backends.resolve(spec).description
    if desc.path and Path(desc.path).is_file():
        data = tomllib.loads(Path(desc.path).read_text())
    else:                           # a built-in backend (numpy, torch:DEVICE): describe it
        impl = desc.implementation
        data = {"backend": {"name": desc.name, "implementation": impl, **({"device": desc.device} if desc.device else {})}}
    data["passes"] = {n: n in on for n in NAMES}
    text = dump_toml(data)
    folder = opscope_home() / "passes"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{desc.name}-{hashlib.sha256(text.encode()).hexdigest()[:10]}.toml"
    path.write_text(text)
    return str(path)


def dump_toml(data: dict) -> str:
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{json.dumps(str(k))} = {value(x)}" for k, x in v.items()) + " }"
        raise TypeError(f"cannot write {v!r} to TOML")
    return "".join(f"[{name}]\n" + "".join(f"{json.dumps(k)} = {value(v)}\n" for k, v in body.items()) + "\n"
                   for name, body in data.items())


def step_seconds(plan, executor, inputs, steps: int = 3) -> tuple[float, float]:
    """(device seconds per step, host wall seconds per step). On a sim chip the device time is the
    chip's simulated clock, fallback ops at their modelled host time: the step time `run`, `train`
    and `profile` report for the same plan (runtime/step_clock.py)."""
    from ..step_clock import StepClock
    clock = StepClock()
    executor.run(*inputs)                       # warm-up
    t0 = time.perf_counter()
    with executor.hooked(clock):
        for _ in range(steps):
            executor.run(*inputs)
    wall = (time.perf_counter() - t0) / steps
    return clock.ns / 1e9 / steps, wall


def measure(model, inputs, graph, backend, passes, *, steps: int = 3, reference=None) -> dict:
    """Compile `graph` with `passes` on `backend`, run it: step time, peak bytes, error vs eager."""
    from ..executor import Executor, compile_plan
    from ..session import compare, eager_outputs
    plan = compile_plan(graph, backend, passes=list(passes))
    ex = Executor(plan)
    device, wall = step_seconds(plan, ex, inputs, steps)
    out = ex.run_host(*inputs)
    err = compare(out, reference if reference is not None else eager_outputs(model, inputs))
    batch = next((int(x.shape[0]) for x in inputs if hasattr(x, "shape") and len(x.shape)), 1)
    return {"passes": list(passes), "step_seconds": device, "wall_seconds": wall,
            "throughput": batch / device if device > 0 else 0.0, "peak_bytes": plan.peak_bytes,
            "max_abs_err": err["max_abs"], "nodes": len(plan.graph.nodes), "pass_log": plan.pass_log}


def estimate(graph, backend, current, name) -> float:
    """Seconds per step the cost model expects pass `name` to save on top of `current` (sim chips:
    the roofline, layout changes included; host backends: launches saved at the median op time)."""
    from ..executor import compile_plan
    from ..roofline import node_seconds
    from ..backends.sim_backend import SimClock, layout_seconds

    def cost(names):
        plan = compile_plan(graph, backend, passes=list(names))
        if isinstance(backend.clock, SimClock):
            d = backend.description
            return sum(node_seconds(st.node, d) + layout_seconds(st.node, d)
                       for st in plan.steps if st.backend is backend)
        return float(len(plan.steps))
    before, after = cost(current), cost(list(current) + [name])
    return before - after
