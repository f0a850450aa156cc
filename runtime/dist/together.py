"""Shares measured together: one process per rank on this host, stepping in lockstep as the job's ranks do.

    shares, shapes, small = measure_together("demo:gpt", ["torch:cpu"] * 2, [0.5, 0.5], repeats=9,
                                             optimizer="sgd", threads=1)

`train --hybrid`'s ranks on one host share its cores, its memory bandwidth and whatever else runs there;
a share timed alone in the simulator's process has all of them (demo:gpt's forward+backward was 108 ms alone
and 177 ms in a 2-rank job on 2 cores with a third process busy). Here each share's step runs in its own
process (`python -m opscope.runtime.dist.together`, the job's threads each, a gloo group of them all) and
the processes meet where the job's ranks meet, with a small all-reduce: after forward+backward (the
gradient all-reduce) and after the optimizer and the trainer's bookkeeping (the parameter check). A rank that waits
there sleeps and leaves its core to the others, as in the job, and the phase the job pays is the slowest
rank's: each phase's time is the median over the steps of the slowest rank's time in that step, so a rank
descheduled now and then (a straggler) counts as it does in the job. What a step takes beyond its slowest
phases is what its two meetings cost: one latency-bound collective as the job issues it on this host (the
ranks' wake-ups on shared cores included), which a back-to-back micro-benchmark does not see.
"""
from __future__ import annotations

import json
import os
import statistics

ENV = "OPSCOPE_MEASURE_SHARE"
MARK = "@opscope-share "


def measure_together(model_spec: str, specs: list[str], ratios: list[float], *, repeats: int, optimizer: str,
                     threads: int, timeout_s: float = 600.0) -> tuple[list[dict], list, float]:
    """(each share's measurement, as ShareTimer.time gives it with every phase the slowest rank's per step,
    each share's ModelShape, the seconds of one latency-bound collective where the ranks meet)."""
    from .local_ranks import run_local_ranks
    from .shape import Layer, ModelShape
    world = len(specs)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads),
           ENV: json.dumps({"model": model_spec, "specs": specs, "ratios": ratios, "repeats": repeats,
                            "optimizer": optimizer, "threads": threads})}
    results = run_local_ranks("opscope.runtime.dist.together", world, env, MARK, timeout_s=timeout_s,
                              what=f"timing the shares together ({world} processes)")
    shapes = [ModelShape(**{**r["shape"], "layers": [Layer(**lay) for lay in r["shape"]["layers"]]})
              for r in results]
    shares = [r["share"] for r in results]
    return slowest_per_step(shares), shapes, small_collective_seconds(shares)


def small_collective_seconds(shares: list[dict]) -> float:
    """What one latency-bound collective costs where the job issues one: per step, what the lockstep step took
    beyond its slowest phases (the longest step over the ranks, less the slowest rank's forward+backward,
    optimizer and host work), per meeting; the median over the steps. Beside the collective's own latency this
    holds what no rank's phase timer sees: a rank that leaves a meeting late because its core was taken (on a
    busy host, several ms per wake-up), which the last arrival's time in the meeting alone missed (0.4 ms
    against 5 ms per collective in demo:mlp's job)."""
    runs = [s["runs"] for s in shares]
    steps = min(len(r) for r in runs)
    extra = [max(r[i][5] for r in runs) - sum(max(r[i][k] for r in runs) for k in range(3)) for i in range(steps)]
    return max(0.0, statistics.median(extra) / 2)


def slowest_per_step(shares: list[dict]) -> list[dict]:
    """Each share with its phases set to what the job pays for them: per step, the slowest rank's time
    (forward+backward, then optimizer, then host bookkeeping), the median over the steps."""
    runs = [s["runs"] for s in shares]
    steps = min(len(r) for r in runs)
    grad, opt, host = (statistics.median(max(r[i][k] for r in runs) for i in range(steps)) for k in range(3))
    out = []
    for s in shares:
        fb = s["forward_seconds"] + s["backward_seconds"]
        f = s["forward_seconds"] / fb if fb > 0 else 1 / 3
        out.append({**s, "forward_seconds": grad * f, "backward_seconds": grad * (1 - f), "optimizer_seconds": opt,
                    "compute_seconds": grad + opt, "compute_ns": round((grad + opt) * 1e9), "host_seconds": host,
                    "own_compute_seconds": s["compute_seconds"]})
    return out


def _main() -> None:
    from dataclasses import asdict

    import torch
    import torch.distributed as dist

    from .. import models
    from ..comm import init_process_group
    from .share_timer import ShareTimer, share_inputs
    job = json.loads(os.environ[ENV])
    torch.set_num_threads(int(job["threads"]))
    rank = int(os.environ["RANK"])
    init_process_group(rank, int(os.environ["WORLD_SIZE"]), "env://", backend="gloo")
    model, inputs = models.load_train(job["model"])
    timer = ShareTimer(model, job["model"], job["specs"][rank], share_inputs(inputs, job["ratios"])[rank],
                       job["optimizer"])
    dist.barrier()                         # every share captured before any is timed
    world = int(os.environ["WORLD_SIZE"])
    # the job's own latency-bound collective where its ranks meet (the loss all-reduce's size)
    share = timer.time(int(job["repeats"]),
                       sync=lambda: dist.all_reduce(torch.zeros(1 + 3 * world, dtype=torch.float64)))
    print(MARK + json.dumps({"share": share, "shape": asdict(timer.shape)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _main()
