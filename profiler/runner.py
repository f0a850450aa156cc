"""The runner: runs the model and streams its events to a collector.

    python -m opscope.profiler.runner --endpoint tcp://127.0.0.1:PORT --model demo:gpt --backend torch:cpu ...

`execute()` is the part that does not care where events go; profile() calls it in-process
when the caller hands over model objects instead of a spec.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

from opscope.runtime.errors import UsageError

ENGINES = ("graph", "eager")


def check_eager_backend(backend, backend_spec: str) -> None:
    if not backend.name.startswith("torch:"):
        raise UsageError(f"--engine eager runs PyTorch itself, so it needs a torch backend, not {backend_spec!r}: "
                         "use --backend torch:cpu or torch:cuda:0")


def execute(sink, *, model_spec: str, backend_spec: str, steps: int = 1, warmup: int = 0, values: bool = False,
            engine: str = "graph", allow_fallback: bool = True, model=None, inputs=None, on_meta=None) -> int:
    """Warm up (unrecorded), then record `steps` steps into `sink`; returns events recorded."""
    if engine == "eager":
        from opscope.runtime import backends, models
        from .eager import run_eager
        backend = backends.resolve(backend_spec)
        check_eager_backend(backend, backend_spec)
        if model is None:
            model, inputs = models.load(model_spec)
        if on_meta:
            on_meta({"backend": backend.name, "device": backend.device, "description": backend.description.as_dict()})
        return run_eager(model, inputs, sink, steps=steps, warmup=warmup, values=values, backend=backend.name,
                         device=backend.device)

    from opscope.runtime import open_session
    from .recorder import Recorder
    s = open_session(model_spec, backend_spec, allow_fallback=allow_fallback, model=model, inputs=inputs)
    if on_meta:
        rep = s.plan.placement.report()
        on_meta({"backend": s.backend.name, "device": s.backend.device, "nodes": len(s.graph.nodes),
                 "description": s.backend.description.as_dict(), "placement": rep})
    for _ in range(warmup):
        s.run()
    rec = Recorder(sink, values=values)
    with s.executor.hooked(rec):
        for _ in range(steps):
            s.run()
    return rec.events


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m opscope.profiler.runner")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--backend", required=True)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--values", action="store_true")
    p.add_argument("--engine", choices=ENGINES, default="graph")
    p.add_argument("--no-fallback", action="store_true")
    p.add_argument("--hwm", type=int, default=64)
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = _args(argv)
    from .stream import StreamSink
    sink = StreamSink(a.endpoint, hwm=a.hwm)
    sink.control("hello", pid=os.getpid(), t_ns=time.perf_counter_ns())
    code = 0
    try:
        n = execute(sink, model_spec=a.model, backend_spec=a.backend, steps=a.steps, warmup=a.warmup,
                    values=a.values, engine=a.engine, allow_fallback=not a.no_fallback,
                    on_meta=lambda meta: sink.control("meta", **meta))
        sink.control("end", status="ok", error=None, error_kind=None, events=n)
    except Exception as e:
        from opscope.runtime.errors import OpscopeError
        kind = "usage" if isinstance(e, UsageError) else "model"
        msg = str(e) if isinstance(e, OpscopeError) else f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        if not isinstance(e, OpscopeError):
            traceback.print_exc()           # into the runner log the run keeps as an artifact
        sink.control("end", status="failed", error=msg, error_kind=kind)
        code = 2 if kind == "usage" else 1
    sink.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
