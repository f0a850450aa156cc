"""Multi-process runs over torch.distributed (gloo on CPU, nccl on CUDA) and torchrun.

    report = train("demo:gpt", HybridStrategy(ratios={"torch:cpu": 0.7, "sim:npu-a1": 0.3}), steps=5)
    report["losses"], report["identical_parameters"], report["events"]     # one process per share
    # the same from a shell, spawned by opscope or under torchrun:
    #   python -m opscope.app.hybrid demo:gpt --hybrid torch:cpu=0.7,sim:npu-a1=0.3 [--rebalance]   (app/hybrid.py)
    #   torchrun --nproc-per-node 2 -m opscope.app.hybrid demo:gpt --hybrid torch:cpu=0.7,sim:npu-a1=0.3
    predict(measure("demo:gpt", ["sim:npu-a1"], [1.0]), ranks=1024, link=Interconnect(1e11, 5e-6))

Rooms: job.py (what a job is, one rank of it), launch.py (spawn and watch the ranks), trainer.py (one
rank's step: its rows, weighted all-reduce, optimizer), split.py (the training step cut at the
optimizer), balance.py (shares, auto ratios, re-balancing), thermal.py (sim chips' throttling),
simulate.py (what-if at N ranks), cli_support.py (the job's report). The flags, the store and --shared-dir
are the tools' (app/hybrid.py, profiler/hybrid_rank.py): nothing here imports them.
"""
from __future__ import annotations


def train(model: str, strategy, *, steps: int = 5, optimizer: str = "sgd", lr: float | None = None,
          rebalance: bool = False, timeout_s: float = 60.0) -> dict:
    """Hybrid data-parallel training of a model spec, one process per share. `strategy` is a
    HybridStrategy (runtime/hybrid.py) or a --hybrid string ('A=0.7,B=0.3', 'auto:A,B'). Returns the
    report; a rank that fails raises ModelError with one line naming it."""
    from ..errors import ModelError
    from .cli_support import summarize
    from .job import DistJob
    from .launch import launch
    lr = lr if lr is not None else (1e-2 if optimizer == "sgd" else 1e-3)
    kw = dict(steps=steps, optimizer=optimizer, lr=lr, rebalance=rebalance, timeout_s=timeout_s)
    if isinstance(strategy, str):
        job = DistJob.parse(model, strategy, **kw)
    else:
        job = DistJob(model=model, specs=list(strategy.ratios), ratios=list(strategy.ratios.values()),
                      switch_threshold=strategy.switch_threshold,
                      hybrid=",".join(f"{k}={v:g}" for k, v in strategy.ratios.items()), **kw)
        job.check()
    result = launch(job)
    report = summarize(job, result.records, result.error)
    if result.error:
        raise ModelError(result.error)
    return report


from .simulate import Interconnect, measure, predict  # noqa: E402

__all__ = ["Interconnect", "measure", "predict", "train"]
