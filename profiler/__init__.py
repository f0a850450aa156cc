"""opscope.profiler: per-op events from a running model, a live stream, and the run store.

    from opscope.profiler import profile, start_profile, RunStore
    run_id = profile("demo:gpt", "torch:cpu", steps=3, warmup=1)
    RunStore().op_stats(run_id)
"""
from .live import LiveRun, RunFailed, profile, start_profile
from .store import RunStore

__all__ = ["LiveRun", "RunFailed", "RunStore", "profile", "start_profile"]
