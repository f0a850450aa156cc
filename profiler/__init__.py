"""opscope.profiler: per-op events from a running model, a live stream, and the run store.

    from opscope.profiler import profile, start_profile, RunStore
    run_id = profile("demo:gpt", "torch:cpu", steps=3, warmup=1)
    RunStore().op_stats(run_id)
    opscope.profiler.step()      # in a script run by `opscope profile -- python train.py`: ends a step
"""
from .live import LiveRun, RunFailed, profile, start_profile, start_script
from .script import step
from .store import RunStore

__all__ = ["LiveRun", "RunFailed", "RunStore", "profile", "start_profile", "start_script", "step"]
