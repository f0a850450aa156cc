"""`opscope simulate` checked against measurement: predicted vs measured step time of data-parallel
`train --hybrid torch:cpu=...` on 2 and 4 CPU ranks (gloo, one thread per rank), with and without
bucketed overlap. Every round calibrates just before its jobs: the link by a gloo all-reduce
micro-benchmark with as many processes as the job has ranks, the shares' steps timed together, one
process per rank in lockstep (runtime/dist/together.py: the cores shared as in the job, stragglers
included). Medians of the steps after the first, then of the rounds; per case the ratio
predicted/measured, the error (the aim: within 25%), the load average, and a line that puts the
prediction's parts (forward+backward, optimizer, host bookkeeping, gradient collectives and how much of
them overlap hides, the latency-bound loss and check collectives) beside what the ranks measured.

Each prediction is compared with a job matched to it: the same model, optimizer, strategy (data parallel),
shares and overlap, and the bucket size the job chose (`--bucket-mb` unset: the job's automatic one); a
mismatch stops the benchmark instead of printing a ratio of two different things. demo:gpt on 4 ranks runs
with a batch of 4 rows (gpt_4_rows below; the demo has 2).

    python benchmarks/bench_dist.py [--quick] [--model demo:gpt --model demo:cnn] [--ranks 2 --ranks 4]
"""
from __future__ import annotations

import argparse
import os
import statistics


def run_job(model: str, ranks: int, overlap: bool, bucket_mb: float | None, steps: int,
            optimizer: str) -> dict:
    """One real job, rank 0's view: median step seconds and exposed gradient communication, and what it ran
    (model, optimizer, strategy, shares, overlap, bucket bytes) for the match with its prediction."""
    from opscope.runtime.dist.cli_support import summarize
    from opscope.runtime.dist.job import DistJob
    from opscope.runtime.dist.launch import launch
    hybrid = ",".join([f"torch:cpu={1 / ranks:g}"] * ranks)
    job = DistJob.parse(model, hybrid, steps=steps, timeout_s=120, overlap=overlap, bucket_mb=bucket_mb,
                        optimizer=optimizer, lr=1e-2 if optimizer == "sgd" else 1e-3)
    result = launch(job)
    if result.error:
        raise SystemExit(f"bench_dist: {result.error}")
    report = summarize(job, result.records, None)
    done = report["steps"][1:]          # step 1 warms up
    return {"step": statistics.median(s["step_seconds"] for s in done),
            "exposed": statistics.median(s["exposed_gradient_comm_seconds"] for s in done),
            "phases": phases(result.records),
            "model": model, "optimizer": job.optimizer, "strategy": job.shard or "dp", "shares": report["shares"]["used"],
            "overlap": overlap, "bucket_bytes": (report.get("buckets") or {}).get("bytes")}


def phases(records: list[dict]) -> dict:
    """What the ranks measured, per phase (medians over the steps after the first): forward+backward's wall
    time of the slowest rank and of rank 0, rank 0's wait for the gradients and the loss (the reduction span),
    its optimizer, and its parameter check (the digest all-gather); what the prediction's parts are held to."""
    per = {}
    for r in records:
        if r.get("kind") == "step" and r["step"] > 0:
            (_, start, _), (_, red0, red1), (_, o0, o1), (_, c0, c1) = r["spans"]
            per.setdefault(r["rank"], []).append({"compute": (red0 - start) / 1e9, "reduction": (red1 - red0) / 1e9,
                                                  "optimizer": (o1 - o0) / 1e9, "check": (c1 - c0) / 1e9})
    med = {k: {p: statistics.median(s[p] for s in steps) for p in steps[0]} for k, steps in per.items()}
    return {**med[0], "slowest_compute": max(m["compute"] for m in med.values())}


def check_match(job: dict, m, overlap: bool) -> None:
    """Stop on a job that is not the one predicted (a ratio of two different things says nothing)."""
    shares = [round(s["rows"] / sum(x["rows"] for x in m.shares), 4) for s in m.shares]
    if not (job["model"] == m.model and job["optimizer"] == m.optimizer and job["strategy"] == "dp"
            and job["overlap"] == overlap and [round(u, 4) for u in job["shares"]] == shares):
        raise SystemExit(f"bench_dist: the job ran {job} but the prediction is for {m.model}, {m.optimizer}, dp, "
                         f"shares {shares}, overlap {overlap}")


def breakdown(p: dict, job: dict, fit: dict) -> str:
    """The prediction's parts beside what rank 0 measured, phase by phase (ms)."""
    grads = next(c for c in p["collectives"] if "gradients" in c["what"])
    control = sum(c["exposed"] for c in p["collectives"] if "latency" in c["what"])
    opt = p["shares"][0]["optimizer_seconds"]
    ph = job["phases"]
    return (f"predicted: fwd+bwd {(p['compute_seconds'] - opt) * 1e3:.1f}, optimizer {opt * 1e3:.1f}, host "
            f"{p['host_seconds'] * 1e3:.1f}, gradients {grads['exposed'] * 1e3:.1f} of {grads['seconds'] * 1e3:.1f} "
            f"exposed{' (hides %.0f%%)' % (p['overlap_hidden'] * 100) if p.get('overlap_hidden') is not None else ''}"
            f", loss+check collectives {control * 1e3:.1f} | measured: fwd+bwd {ph['compute'] * 1e3:.1f} (slowest "
            f"rank {ph['slowest_compute'] * 1e3:.1f}), reduction {ph['reduction'] * 1e3:.1f} (gradients exposed "
            f"{job['exposed'] * 1e3:.1f}), optimizer {ph['optimizer'] * 1e3:.1f}, check {ph['check'] * 1e3:.1f} | link "
            f"{fit['bandwidth'] / 1e9:.2g} GB/s {fit['latency'] * 1e6:.0f} us ({fit['ranks']} ranks), latency used "
            f"{p['interconnect']['latency'] * 1e6:.0f} us")


GPT_ROWS = 4


def gpt_4_rows():
    """demo:gpt's training form with a batch of 4 rows: the demo's 2 have no row for a 3rd and 4th rank (the
    demo's batch is its only size knob: a factory is how a model spec gets another)."""
    import torch

    from opscope.runtime.demos import gpt
    from opscope.runtime.demos.losses import NextToken
    model, _ = gpt.factory()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 2048, (GPT_ROWS, 129), generator=g)
    return NextToken(model), (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def batch_for(model: str, ranks: int) -> str:
    """The model spec to run on `ranks` ranks: demo:gpt's 4-row form when its 2 rows do not split."""
    return f"{os.path.abspath(__file__)}:gpt_4_rows" if model == "demo:gpt" and ranks > 2 else model


def rows_of(spec: str) -> int:
    from opscope.runtime import models
    return int(models.load_train(spec)[1][0].shape[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="models (default demo:gpt, demo:cnn and demo:mlp)")
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"])
    ap.add_argument("--ranks", type=int, action="append", help="rank counts (default 2 and 4)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="rounds of calibration then jobs per case (medians)")
    ap.add_argument("--bucket-mb", type=float, default=None, help="--overlap bucket size (default: the job's own, "
                                                                  "a quarter of the model's gradients)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 4 steps, 1 repeat, 2 ranks")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.repeats, args.ranks = 4, 1, args.ranks or [2]
    models = args.model or ["demo:gpt", "demo:cnn", "demo:mlp"]
    os.environ["OMP_NUM_THREADS"] = "1"          # one thread per rank, as torchrun sets (children inherit it)
    import torch
    torch.set_num_threads(1)
    from opscope.runtime.dist.collectives import Interconnect
    from opscope.runtime.dist.linkbench import measure_link, save_link
    from opscope.runtime.dist.simulate import measure, predict
    from opscope.runtime.errors import UsageError

    cores = len(os.sched_getaffinity(0))
    print(f"{', '.join(models)}: data parallel ({args.optimizer}) on torch:cpu ranks (gloo, 1 thread each, {cores} "
          f"cores, load average {os.getloadavg()[0]:.1f}), {args.steps} steps, {args.repeats} round(s) of calibration "
          "then jobs per case (medians)")
    print(f"{'case':<40} {'predicted':>10} {'measured':>10} {'ratio':>6} {'error':>6}   {'load':>5}")
    ratios = []
    for n in args.ranks or [2, 4]:
        for model in models:
            spec = batch_for(model, n)
            rounds = {False: [], True: []}
            for _ in range(args.repeats):
                # calibrated just before its jobs, every round: on a shared host the load drifts
                fit = measure_link(ranks=n)
                save_link(fit)
                link = Interconnect(fit["bandwidth"], fit["latency"], "ring", "measured", ranks=n)
                try:
                    # what `opscope simulate --hybrid torch:cpu=...` calls by default: the shares timed together
                    m = measure(spec, ["torch:cpu"] * n, [1 / n] * n, optimizer=args.optimizer, repeats=9,
                                together=True)
                except UsageError as e:        # a batch with no row for every rank
                    print(f"{model} {n} ranks: skipped, {e}")
                    break
                for overlap in (False, True):
                    job = run_job(spec, n, overlap, args.bucket_mb, args.steps, args.optimizer)
                    check_match(job, m, overlap)
                    bucket = job["bucket_bytes"] or 25 * 2 ** 20
                    p = predict(m, n, link, overlap=overlap, bucket_bytes=bucket, cores_per_node=cores)
                    rounds[overlap].append((p, job, fit, os.getloadavg()[0]))
            for overlap, done in rounds.items():
                if not done:
                    continue
                ratio = statistics.median(p["step_seconds"] / job["step"] for p, job, _, _ in done)
                ratios.append(ratio)
                p, job, fit, load = done[len(done) // 2]
                bucket = job["bucket_bytes"] or 25 * 2 ** 20
                name = model if spec == model else f"{model} ({rows_of(spec)} rows)"
                case = f"{name} {n} ranks, " + (f"overlap ({bucket / 2 ** 20:.2g} MiB)" if overlap else "no overlap")
                print(f"{case:<40} {statistics.median(p['step_seconds'] for p, *_ in done) * 1e3:8.2f}ms "
                      f"{statistics.median(j['step'] for _, j, *_ in done) * 1e3:8.2f}ms {ratio:6.2f} "
                      f"{(ratio - 1) * 100:+5.0f}%   {statistics.median(x[3] for x in done):5.1f}", flush=True)
                print("    " + breakdown(p, job, fit), flush=True)
    within = sum(abs(r - 1) <= 0.25 for r in ratios)
    print(f"{within} of {len(ratios)} cases within 25% (predicted/measured {min(ratios):.2f} .. {max(ratios):.2f}; "
          f"load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
