"""Scan speed of `opscope migrate scan`: a generated tree of 10,000 files (--quick: 1,000).

The tree mixes what a real code base holds: plain Python with no CUDA (the fast path: only a
syntax check), training scripts full of torch.cuda (parsed with libcst), C++/CUDA sources and a
few broken files. The progress bar is shown on stderr, as users see it. Prints files/s for each
kind and for the whole tree, median of the repeats.

    python benchmarks/bench_migrate.py [--quick] [--repeat N]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from opscope.app.migrate.scan import scan_path

PLAIN = '''"""Utility module {i}."""
import os


def helper_{i}(values):
    total = 0
    for v in values:
        total += v * {i}
    return os.path.join("out", str(total))
'''
CUDA = '''import torch
import torch.distributed as dist

DEVICE = "cuda"


def step_{i}(model, x):
    model = model.cuda()
    with torch.cuda.amp.autocast():
        y = model(x.to(DEVICE))
    torch.cuda.synchronize()
    print(torch.cuda.memory_allocated())
    return y
'''
CU = '''// kernel {i}
__global__ void k{i}(float *a) {{ a[threadIdx.x] *= 2; }}
void run{i}(float *h) {{
  float *d; cudaMalloc(&d, 1024);
  cudaMemcpy(d, h, 1024, cudaMemcpyHostToDevice);
  k{i}<<<1, 256>>>(d);
  cudaDeviceSynchronize(); cudaFree(d);
}}
'''


def make_tree(root: Path, n: int) -> dict[str, int]:
    counts = {"plain": 0, "cuda": 0, "cu": 0, "broken": 0}
    for i in range(n):
        folder = root / f"pkg{i // 500}"
        folder.mkdir(exist_ok=True)
        r = i % 20
        if r < 13:
            (folder / f"util_{i}.py").write_text(PLAIN.format(i=i))
            counts["plain"] += 1
        elif r < 18:
            (folder / f"train_{i}.py").write_text(CUDA.format(i=i))
            counts["cuda"] += 1
        elif r < 19:
            (folder / f"kernel_{i}.cu").write_text(CU.format(i=i))
            counts["cu"] += 1
        else:
            (folder / f"broken_{i}.py").write_text("def f(:\n    torch.cuda.synchronize()\n")
            counts["broken"] += 1
    return counts


def timed(path, progress=False) -> tuple[float, int]:
    t0 = time.perf_counter()
    result = scan_path(path, progress=progress)
    return time.perf_counter() - t0, len(result.findings)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1,000 files instead of 10,000")
    ap.add_argument("--files", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=None)
    args = ap.parse_args()
    n = args.files or (1000 if args.quick else 10_000)
    repeat = args.repeat or 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "tree"
        root.mkdir()
        counts = make_tree(root, n)
        print(f"tree: {n} files ({', '.join(f'{v} {k}' for k, v in counts.items())})")
        # the kinds side by side, interleaved with the whole tree, so machine noise hits all alike
        kinds = {}
        for kind, pattern in (("plain", "util_*.py"), ("cuda", "train_*.py"), ("cu", "kernel_*.cu")):
            sub = Path(tmp) / kind
            sub.mkdir()
            for p in list(root.glob(f"pkg*/{pattern}"))[:200]:
                (sub / p.name).write_bytes(p.read_bytes())
            kinds[kind] = sub
        whole, per_kind = [], {k: [] for k in kinds}
        findings = 0
        for rep in range(repeat):
            s, findings = timed(root, progress=True)
            whole.append(s)
            for k, sub in kinds.items():
                per_kind[k].append(timed(sub)[0])
        files_in = {k: len(list(sub.iterdir())) for k, sub in kinds.items()}
        for k, times in per_kind.items():
            med = statistics.median(times)
            print(f"  {k:6s} {files_in[k] / med:10.0f} files/s  ({files_in[k]} files, median {med * 1e3:.0f} ms)")
        med = statistics.median(whole)
        plain = files_in["plain"] / statistics.median(per_kind["plain"])
        cuda = files_in["cuda"] / statistics.median(per_kind["cuda"])
        print(f"whole tree: {n / med:.0f} files/s ({n} files in {med:.2f} s median of {repeat}, {findings} findings)")
        print(f"ratio: plain files scan {plain / cuda:.1f}x faster than CUDA-heavy ones (syntax check vs libcst)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
