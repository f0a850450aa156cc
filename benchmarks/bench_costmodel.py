"""The learned cost model's accuracy on models it was not trained on (issue: Spearman >= 0.8 aimed).

    python benchmarks/bench_costmodel.py [--models demo:mlp,demo:cnn,demo:gpt,gpt2,bert,llama,t5,vit]
                                         [--backends numpy,torch:cpu,onnxruntime,openvino,xla] [--steps 4] [--quick]

Profiles every model on every backend into a fresh $OPSCOPE_HOME (one intra-op thread, so the times are
the ones a placement search would compare; --stores checks stores profiled before), then leaves each model
out in turn: the cost model is trained
on the other models' runs and predicts the held-out model's op and region times. Printed: Spearman rank
correlation per held-out model and pooled, for ops and for regions (a region: the whole span a stack ran),
beside the naive ranking by FLOPs + bytes that needs no training -- the cost model has to beat it to earn
its place -- and per backend (the stacks' per-op times are their profilers' attribution of fused kernels
back to ops, much noisier than the per-op backends' own spans). Transformers' models are
tests/autoplace_models.py's tiny random-weight configs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = "demo:mlp,demo:cnn,demo:gpt,gpt2,bert,llama,t5,vit"
BACKENDS = "numpy,torch:cpu,onnxruntime,openvino,xla"


def spec(name: str) -> str:
    return name if name.startswith("demo:") else f"{HERE.parent / 'tests' / 'autoplace_models.py'}:{name}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--backends", default=BACKENDS)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="demo models on numpy, torch:cpu and onnxruntime")
    ap.add_argument("--stores", default=None,
                    help="OPSCOPE_HOME folders profiled before (comma-separated): check their runs, profile nothing")
    args = ap.parse_args()
    models = "demo:mlp,demo:cnn,demo:gpt".split(",") if args.quick else args.models.split(",")
    backends = "numpy,torch:cpu,onnxruntime".split(",") if args.quick else args.backends.split(",")
    homes = args.stores.split(",") if args.stores else [tempfile.mkdtemp(prefix="opscope-costmodel-")]
    env = {**os.environ, "OPSCOPE_HOME": homes[0], "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}
    if not args.stores:
        print(f"profiling {len(models)} models x {len(backends)} backends into {homes[0]} "
              f"(load {os.getloadavg()[0]:.1f})")
        for m in models:
            for b in backends:
                t = time.monotonic()
                r = subprocess.run([sys.executable, "-m", "opscope.app", "profile", spec(m), "-b", b, "--steps",
                                    str(args.steps), "--json"], env=env, capture_output=True, text=True)
                status = "ok" if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1][:100]
                print(f"  {m:10s} {b:12s} {time.monotonic() - t:6.1f} s  {status}")

    from opscope.profiler.cost_data import check, collect
    from opscope.profiler.store import RunStore
    ops, regions = [], []
    for home in homes:
        o, r = collect(RunStore(Path(home) / "runs.duckdb"))
        ops += o
        regions += r
    t = time.process_time()
    out = check(ops, regions)
    fit_s = time.process_time() - t
    print(f"\n{len(ops)} measured ops, {len(regions)} regions; {len(out['models'])} leave-one-out fits in "
          f"{fit_s:.1f} s CPU (load {os.getloadavg()[0]:.1f})")
    fmt = lambda v: "   n/a" if v is None or v != v else f"{v:7.3f}"    # noqa: E731
    print(f"{'held-out model':28s} {'ops':>5s} {'model':>7s} {'naive':>7s} {'regions':>8s} {'model':>7s}")
    for m in out["models"]:
        print(f"{Path(m['model']).name[:28]:28s} {m['ops']:5d} {fmt(m['op_spearman'])} {fmt(m['naive_op_spearman'])} "
              f"{m['regions']:8d} {fmt(m['region_spearman'])}")
    print(f"{'pooled':28s} {out['ops']:5d} {fmt(out['op_spearman'])} {fmt(out['naive_op_spearman'])} "
          f"{out['regions']:8d} {fmt(out['region_spearman'])}   (naive regions {fmt(out['naive_region_spearman'])})")
    print(f"\n{'the same held-out ops by backend':28s} {'ops':>5s} {'model':>7s} {'naive':>7s}")
    for b in out["backends"]:
        print(f"{b['backend']:28s} {b['ops']:5d} {fmt(b['op_spearman'])} {fmt(b['naive_op_spearman'])}")
    print("aim: Spearman >= 0.8 on held-out models; 'naive' ranks by FLOPs + bytes with no training")
    print(json.dumps({k: out[k] for k in ("op_spearman", "naive_op_spearman", "region_spearman",
                                          "naive_region_spearman")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
