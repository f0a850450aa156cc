"""Hybrid data parallel: the 2-rank step (two processes, gloo) vs the slowest single rank's share
run alone in one process (what the collective path costs), and `opscope simulate`'s prediction for
2 ranks vs the measured 2-rank step. Medians; ratios printed. --overlap: instead, the exposed gradient
communication per step (the wait after backward) with buckets all-reduced during backward vs one all-reduce
after it, on the same job.

    python benchmarks/bench_dist.py [--quick] [--model demo:mlp] [--hybrid torch:cpu=0.5,numpy=0.5]
    python benchmarks/bench_dist.py --overlap --model demo:gpt --hybrid torch:cpu=0.5,torch:cpu=0.5
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def share_seconds(model_spec: str, specs: list[str], ratios: list[float], repeat: int) -> list[float]:
    """Wall seconds of each share's whole step (gradients + optimizer), alone in this process."""
    from opscope.runtime import backends, models
    from opscope.runtime.dist.balance import split_rows
    from opscope.runtime.dist.split import GradientStep, OptimizerStep
    from opscope.runtime.train.joint import capture_joint
    from opscope.runtime.train.step import OptimizerSpec, build_train_graph

    model, inputs = models.load_train(model_spec)
    out, start = [], 0
    for spec, n in zip(specs, split_rows(ratios, int(inputs[0].shape[0]))):
        local = tuple(x[start:start + n] for x in inputs)
        start += n
        train = build_train_graph(capture_joint(model, local, model_spec), OptimizerSpec("sgd"))
        step, opt = GradientStep(train, backends.resolve(spec)), OptimizerStep(train)
        times = []
        for i in range(repeat + 1):
            t0 = time.perf_counter()
            _, grads = step.run(local)
            step.set_parameters(opt.run(grads))
            if i:                                  # the first run warms up
                times.append(time.perf_counter() - t0)
        out.append(statistics.median(times))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo:mlp")
    ap.add_argument("--hybrid", default="torch:cpu=0.5,numpy=0.5")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--bandwidth", type=float, default=5e9, help="loopback link for the prediction, bytes/s")
    ap.add_argument("--latency", type=float, default=5e-5, help="loopback latency for the prediction, s")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 4 steps")
    ap.add_argument("--overlap", action="store_true", help="exposed communication with and without bucketed overlap")
    ap.add_argument("--bucket-mb", type=float, default=1.0, help="--overlap: bucket size (default 1 MiB)")
    args = ap.parse_args()
    if args.quick:
        args.steps = 4
    torch.set_num_threads(1)
    if args.overlap:
        return overlap(args)

    from opscope.runtime.dist.cli_support import summarize
    from opscope.runtime.dist.job import DistJob
    from opscope.runtime.dist.launch import launch
    from opscope.runtime.dist.simulate import Interconnect, measure, predict

    job = DistJob.parse(args.model, args.hybrid, steps=args.steps, timeout_s=60)
    result = launch(job)
    if result.error:
        raise SystemExit(f"bench_dist: {result.error}")
    report = summarize(job, result.records, None)
    two_rank = statistics.median(s["step_seconds"] for s in report["steps"][1:])   # step 1 warms up
    alone = share_seconds(args.model, job.specs, job.ratios, max(3, args.steps // 2))
    slowest = max(alone)
    print(f"{args.model}, --hybrid {args.hybrid}, {args.steps} steps, gloo on this machine")
    for spec, t in zip(job.specs, alone):
        print(f"  share on {spec:<12} alone: {t * 1e3:8.2f} ms per step (median)")
    print(f"  2-rank step:                {two_rank * 1e3:8.2f} ms  = {two_rank / slowest:.2f}x the slowest share "
          f"alone (collective path overhead {(two_rank - slowest) * 1e3:.2f} ms)")
    m = measure(args.model, job.specs, job.ratios)
    p = predict(m, 2, Interconnect(args.bandwidth, args.latency, "ring", "loopback assumption"))
    print(f"  simulate --ranks 2:         {p['step_seconds'] * 1e3:8.2f} ms  = {p['step_seconds'] / two_rank:.2f}x the "
          f"measured 2-rank step (compute {p['compute_seconds'] * 1e3:.2f} ms from op timers, all-reduce "
          f"{p['communication_seconds'] * 1e3:.3f} ms at {args.bandwidth / 1e9:g} GB/s)")
    print("  note: op timers sum kernel time only; the measured step adds the executor's host work, the "
          "host copies around the all-reduce, and the parameter check")


def overlap(args) -> None:
    from opscope.runtime.dist.cli_support import summarize
    from opscope.runtime.dist.job import DistJob
    from opscope.runtime.dist.launch import launch
    print(f"{args.model}, --hybrid {args.hybrid}, {args.steps} steps, gloo on this machine (medians, step 1 warms up)")
    rows = {}
    for on in (False, True):
        job = DistJob.parse(args.model, args.hybrid, steps=args.steps, timeout_s=60, overlap=on,
                            bucket_mb=args.bucket_mb)
        result = launch(job)
        if result.error:
            raise SystemExit(f"bench_dist: {result.error}")
        steps = summarize(job, result.records, None)["steps"][1:]
        rows[on] = (statistics.median(s["exposed_gradient_comm_seconds"] for s in steps),
                    statistics.median(s["step_seconds"] for s in steps), steps[-1]["buckets"])
        print(f"  {'overlap, ' + str(rows[on][2]) + ' buckets' if on else 'one all-reduce after backward':<32} "
              f"exposed gradient communication {rows[on][0] * 1e3:8.2f} ms, step {rows[on][1] * 1e3:8.2f} ms")
    print(f"  overlap: exposed communication {rows[True][0] / rows[False][0]:.2f}x, step {rows[True][1] / rows[False][1]:.2f}x")


if __name__ == "__main__":
    main()
