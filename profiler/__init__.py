"""opscope.profiler: per-op events from a running model, a live stream, and the run store.

    from opscope.profiler import profile, start_profile, RunStore
    run_id = profile("demo:gpt", "torch:cpu", steps=3, warmup=1)
    RunStore().op_stats(run_id)
    opscope.profiler.step()      # in a script run by `opscope profile -- python train.py`: ends a step
"""
from __future__ import annotations

import importlib

# name -> the module that defines it. NOTE: loaded on first use (PEP 562), not here: importing any
# opscope.profiler.X imports this package first, and the run store pulls in DuckDB (and live.py the
# runtime); the CLI's value checks (profiler/sql.py's bounds, script.py's path check) must stay light.
_WHERE = {"LiveRun": "live", "RunFailed": "live", "profile": "live", "start_profile": "live", "start_script": "live",
          "step": "script", "RunStore": "store"}

__all__ = ["LiveRun", "RunFailed", "RunStore", "profile", "start_profile", "start_script", "step"]


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *__all__})
