"""Training step speed and profiling overhead, side by side in one process (medians, ratios).

    python benchmarks/bench_train.py [--quick] [--model demo:gpt] [--optimizer adamw] [--repeat 30]

(a) one training step (forward, loss, backward, optimizer) of the model through opscope on torch:cpu
    (Trainer.step: the captured plan, parameters resident) vs the same step in eager PyTorch
    (zero_grad, forward, backward, the same single-tensor optimizer). Aim <= 1.10.
(b) what `profile --train` adds to that step (the profiler's Recorder hooked on the executor, events
    kept in memory) vs what torch.profiler (CPU, record_shapes=True) adds to the eager step. Aim < 0.5x.

All sides run interleaved, rotating the order each round, so load drifts on a shared machine hit
them alike; wall and this thread's CPU time are both reported.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from harness import NullSink, add_round_arguments, parse_round_arguments




def sides(model_spec: str, optimizer: str) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from opscope.profiler.recorder import Recorder
    from opscope.runtime import backends, models
    from opscope.runtime.train import DEFAULT_LR, OptimizerSpec, Trainer, loss_of

    opt = OptimizerSpec(optimizer, lr=DEFAULT_LR[optimizer])
    model, inputs = models.load_train(model_spec)
    trainer = Trainer.create(model, inputs, backends.resolve("torch:cpu"), opt, name=model_spec)
    eager_model = copy.deepcopy(model).train()
    eager_opt = opt.torch_optimizer(eager_model.parameters())
    rec = Recorder(NullSink())

    def eager_step():
        eager_opt.zero_grad(set_to_none=True)
        loss = loss_of(eager_model(*inputs))
        loss.backward()
        eager_opt.step()
        return float(loss.detach())

    def eager_profiled():
        with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True):
            eager_step()

    def opscope_profiled():
        with trainer.executor.hooked(rec):
            trainer.step()

    print(f"{model_spec}: {len(trainer.train.graph.nodes)} ops per step ({trainer.phase_counts()}), "
          f"optimizer {opt.name}, torch threads {torch.get_num_threads()}")
    # Trainer.step updates in place unless a hook may read an op's inputs after it ran
    in_place = getattr(rec, "reads_inputs_after_op", True) is False
    print("under profile --train the optimizer updates " + ("in place, as unwatched" if in_place else
          "functionally (the Recorder does not declare reads_inputs_after_op = False): the optimizer's "
          "extra allocations count as overhead"))
    return {"eager": eager_step, "opscope torch:cpu": trainer.step,
            "eager+torch.profiler": eager_profiled, "opscope+profile --train": opscope_profiled}


def measure(fns: dict, repeat: int, warmup: int) -> tuple[dict, dict]:
    for _ in range(warmup):
        for f in fns.values():
            f()
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    items = list(fns.items())
    for i in range(repeat):
        for name, f in items[i % len(items):] + items[:i % len(items)]:
            c0, t0 = time.thread_time(), time.perf_counter()
            f()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.thread_time() - c0)
    return wall, cpu


def report(wall: dict, cpu: dict) -> dict:
    out = {}
    for clock, times in (("wall", wall), ("cpu", cpu)):
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"  {clock}: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in med.items()))
        step_ratio = med["opscope torch:cpu"] / med["eager"]
        ours = med["opscope+profile --train"] / med["opscope torch:cpu"] - 1
        theirs = med["eager+torch.profiler"] / med["eager"] - 1
        print(f"  {clock}: (a) step opscope torch:cpu / eager {step_ratio:.3f} (aim <= 1.10)")
        print(f"  {clock}: (b) profiling overhead: profile --train {100 * ours:+.1f}%, torch.profiler "
              f"{100 * theirs:+.1f}%, ratio {ours / theirs if theirs > 0 else float('nan'):.2f} (aim < 0.5)")
        out[clock] = {"step_ratio": step_ratio, "overhead_ratio": ours / theirs if theirs > 0 else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_round_arguments(ap)
    ap.add_argument("--optimizer", default="adamw", choices=["sgd", "adamw"])
    args = parse_round_arguments(ap)
    torch.set_num_threads(args.threads)
    fns = sides(args.model, args.optimizer)
    wall, cpu = measure(fns, args.repeat, args.warmup)
    print(f"median of {args.repeat} interleaved rounds:")
    report(wall, cpu)


if __name__ == "__main__":
    main()
