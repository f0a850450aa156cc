"""`opscope simulate` checked against measurement: predicted vs measured step time of data-parallel
`train --hybrid torch:cpu=...` on 2 and 4 CPU ranks (gloo, one thread per rank), with and without
bucketed overlap, after calibration (the link measured by a gloo all-reduce micro-benchmark, each
share's step measured in this process). Medians of the steps after the first, then of the repeats;
the ratio predicted/measured per case (the aim: within 25%), and the exposed gradient communication
(the wait after backward) beside its prediction.

    python benchmarks/bench_dist.py [--quick] [--model demo:mlp] [--ranks 2 --ranks 4] [--bucket-mb 0.25]
"""
from __future__ import annotations

import argparse
import os
import statistics


def run_job(model: str, ranks: int, overlap: bool, bucket_mb: float, steps: int) -> tuple[float, float]:
    """(median step seconds, median exposed gradient communication) of one real job, rank 0's view."""
    from opscope.runtime.dist.cli_support import summarize
    from opscope.runtime.dist.job import DistJob
    from opscope.runtime.dist.launch import launch
    hybrid = ",".join([f"torch:cpu={1 / ranks:g}"] * ranks)
    job = DistJob.parse(model, hybrid, steps=steps, timeout_s=60, overlap=overlap, bucket_mb=bucket_mb)
    result = launch(job)
    if result.error:
        raise SystemExit(f"bench_dist: {result.error}")
    done = summarize(job, result.records, None)["steps"][1:]          # step 1 warms up
    return (statistics.median(s["step_seconds"] for s in done),
            statistics.median(s["exposed_gradient_comm_seconds"] for s in done))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo:mlp")
    ap.add_argument("--ranks", type=int, action="append", help="rank counts (default 2 and 4)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="jobs per case (the median is reported)")
    ap.add_argument("--bucket-mb", type=float, default=0.25, help="--overlap bucket size (demo:mlp has 1.5 MiB "
                                                                  "of gradients: 6 buckets)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 4 steps, 1 repeat, 2 ranks")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.repeats, args.ranks = 4, 1, args.ranks or [2]
    os.environ["OMP_NUM_THREADS"] = "1"          # one thread per rank, as torchrun sets (children inherit it)
    import torch
    torch.set_num_threads(1)
    from opscope.runtime.dist.collectives import Interconnect
    from opscope.runtime.dist.linkbench import measure_link, save_link
    from opscope.runtime.dist.simulate import measure, predict

    cores = len(os.sched_getaffinity(0))
    print(f"{args.model}, data parallel on torch:cpu ranks (gloo, 1 thread each, {cores} cores, load average "
          f"{os.getloadavg()[0]:.1f}), {args.steps} steps, {args.repeats} job(s) per case")
    ratios = []
    for n in args.ranks or [2, 4]:
        # calibrated just before its cases: on a shared host the link drifts with the load
        fit = measure_link()
        save_link(fit)
        link = Interconnect(fit["bandwidth"], fit["latency"], "ring", "measured")
        print(f"link calibrated: {fit['bandwidth'] / 1e9:.3g} GB/s, {fit['latency'] * 1e6:.1f} us (gloo all-reduce "
              "after compute, 2 processes; ring fit: " + ", ".join(
                  f"{p['bytes'] >> 10} KiB {p['measured_seconds'] * 1e3:.2f}/{p['model_seconds'] * 1e3:.2f} ms"
                  for p in fit["points"]) + " measured/model)")
        print(f"{'case':<28} {'predicted':>10} {'measured':>10} {'ratio':>6}   {'exposed grad comm pred/meas':>28}   "
              "prediction = compute + host + comm")
        m = measure(args.model, ["torch:cpu"] * n, [1 / n] * n)
        for overlap in (False, True):
            p = predict(m, n, link, overlap=overlap, bucket_bytes=int(args.bucket_mb * 2 ** 20), cores_per_node=cores)
            runs = [run_job(args.model, n, overlap, args.bucket_mb, args.steps) for _ in range(args.repeats)]
            step = statistics.median(r[0] for r in runs)
            exposed = statistics.median(r[1] for r in runs)
            grads = next(c for c in p["collectives"] if "gradients" in c["what"])
            ratio = p["step_seconds"] / step
            ratios.append(ratio)
            case = f"{n} ranks, " + (f"overlap ({args.bucket_mb:g} MiB)" if overlap else "no overlap")
            print(f"{case:<28} {p['step_seconds'] * 1e3:8.2f}ms {step * 1e3:8.2f}ms {ratio:6.2f}   "
                  f"{grads['exposed'] * 1e3:13.2f} / {exposed * 1e3:6.2f} ms   {p['compute_seconds'] * 1e3:.2f} + "
                  f"{p['host_seconds'] * 1e3:.2f} + {p['communication_seconds'] * 1e3:.2f} ms")
    within = sum(abs(r - 1) <= 0.25 for r in ratios)
    print(f"{within} of {len(ratios)} cases within 25% (predicted/measured {min(ratios):.2f} .. {max(ratios):.2f})")


if __name__ == "__main__":
    main()
