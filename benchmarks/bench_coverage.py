"""Coverage: PyTorch OpInfo pass counts per backend, and the speed of `opscope backend check`
(conformance cells, ops and cases per second) per backend.

    python benchmarks/bench_coverage.py [--quick] [--backends numpy,torch:cpu,sim:npu-a1]

--quick checks a fixed handful of OpInfos instead of all ~600 (the full run takes minutes).
"""
from __future__ import annotations

import argparse
import time

import torch

from opscope.runtime.backends import resolve
from opscope.runtime.conformance import check
from opscope.runtime.opinfo import STATUSES, check_opinfo

QUICK = ["add", "mul", "exp", "sum", "softmax", "nn.functional.conv2d", "nn.functional.linear", "topk", "sort",
         "nn.functional.interpolate.bilinear", "index_put", "scatter_reduce.sum", "nn.functional.layer_norm", "where"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="numpy,torch:cpu,sim:npu-a1")
    ap.add_argument("--quick", action="store_true", help=f"only {len(QUICK)} OpInfos")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: stabler on a shared machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    specs = [s.strip() for s in args.backends.split(",") if s.strip()]

    print(f"PyTorch OpInfo, float32, first 3 samples per OpInfo ({'quick subset' if args.quick else 'all'})")
    print(f"{'backend':<12}" + "".join(f"{s:>13}" for s in STATUSES) + f"{'seconds':>10}")
    for spec in specs:
        r = check_opinfo(resolve(spec), names=QUICK if args.quick else None)
        c = r.counts()
        print(f"{spec:<12}" + "".join(f"{c[s]:>13}" for s in STATUSES) + f"{r.seconds:>10.1f}")

    print("\n`opscope backend check` (opscope's own samples, every claimed op x dtype)")
    print(f"{'backend':<12}{'ops':>6}{'cells':>7}{'cases':>7}{'seconds':>9}{'ops/s':>8}{'cases/s':>9}")
    for spec in specs:
        b = resolve(spec, with_fallback=False)
        t0 = time.perf_counter()
        report = check(b)
        dt = time.perf_counter() - t0
        ops = len({c.op for c in report.cells})
        cases = sum(c.cases for c in report.cells)
        print(f"{spec:<12}{ops:>6}{len(report.cells):>7}{cases:>7}{dt:>9.1f}{ops / dt:>8.1f}{cases / dt:>9.1f}")


if __name__ == "__main__":
    main()
