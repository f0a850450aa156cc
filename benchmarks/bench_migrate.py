"""Scan speed of `opscope migrate scan` on a real-size tree, with one worker and with --jobs.

The generated tree looks like a training code base (apex, Megatron, a research repo): Python modules
of 1-3k lines that mix model code, data loading and CUDA-heavy training loops; C++/CUDA sources of
1-2k lines with kernels, host code and cuBLAS/NCCL calls; a share of plain utility modules. Prints
start-up time (what `opscope migrate scan --help` costs), then files/s and lines/s for each --jobs,
median of interleaved repeats.

Then `migrate apply` (the CUDA -> HIP rewrite) on the real C/C++ corpus (tests/data/cuda-samples: its Samples/ tree
of cuda-samples' programs and the Common/ helpers they include) against
hipify-perl on the same files: lines/s of each and the ratio, in process and as commands (start-up included).

    python benchmarks/bench_migrate.py [--quick] [--repeat N] [--hipify-perl PATH/TO/bin/hipify-perl]
"""
from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from opscope.app.migrate.scan import scan_path

PY_BLOCKS = [
    '''

class Block{i}(nn.Module):
    """A transformer block, as model files have dozens of."""

    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = nn.MultiheadAttention(cfg.n_embd, cfg.n_head, dropout=cfg.dropout, batch_first=True)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x, mask=None):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))
''',
    '''

def get_batch_{i}(split, data_dir, block_size, batch_size, device, device_type):
    data = np.memmap(os.path.join(data_dir, f"{{split}}.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy((data[i:i + block_size]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64)) for i in ix])
    if device_type == "cuda":
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y
''',
    '''

def train_step_{i}(model, optimizer, scaler, batch, args):
    model.train()
    images, target = batch
    if torch.cuda.is_available():
        images = images.cuda(args.gpu, non_blocking=True)
        target = target.cuda(args.gpu, non_blocking=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        output = model(images)
        loss = F.cross_entropy(output, target)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    torch.cuda.synchronize()
    return loss.item(), torch.cuda.max_memory_allocated() / 2**30
''',
    '''

@torch.no_grad()
def evaluate_{i}(model, loader, criterion, device):
    model.eval()
    total, correct, loss_sum = 0, 0, 0.0
    for images, target in loader:
        images, target = images.to(device), target.to(device)
        out = model(images)
        loss_sum += criterion(out, target).item() * images.size(0)
        correct += (out.argmax(1) == target).sum().item()
        total += images.size(0)
    return loss_sum / max(total, 1), correct / max(total, 1)
''',
    '''

def setup_distributed_{i}(args):
    if "RANK" in os.environ:
        dist.init_process_group(backend="nccl")
        args.rank = int(os.environ["RANK"])
        args.local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(args.local_rank)
        args.device = f"cuda:{{args.local_rank}}"
    else:
        args.rank, args.local_rank, args.device = 0, 0, "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    return args
''',
    '''

def cosine_lr_{i}(it, warmup_iters, lr_decay_iters, learning_rate, min_lr):
    """Learning-rate schedule: linear warm-up, then cosine decay to min_lr."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (learning_rate - min_lr)
''',
]
PY_HEAD = '''"""Module {i}: model, data and training code."""
import math
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
'''
PLAIN = '''

def helper_{i}(values, scale={i}):
    """Pure Python, no CUDA: the scanner's fast path."""
    total = 0
    for v in values:
        total += v * scale
    return os.path.join("out", str(total))
'''
CU_HEAD = '''// Fused kernels {i}
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <nccl.h>
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
'''
CU_BLOCKS = [
    '''
template <typename T>
__global__ void layernorm_fwd_{i}(const T* __restrict__ x, T* __restrict__ y, const float* w, int n) {{
    __shared__ float s_mean, s_var;
    int row = blockIdx.x, tid = threadIdx.x;
    float sum = 0.f;
    for (int j = tid; j < n; j += blockDim.x) sum += (float)__ldcs(&x[row * n + j]);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, o);
    if (tid == 0) s_mean = sum / n;
    __syncthreads();
    for (int j = tid; j < n; j += blockDim.x) y[row * n + j] = (T)(((float)x[row * n + j] - s_mean) * w[j]);
}}
''',
    '''
void launch_{i}(torch::Tensor x, torch::Tensor y) {{
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    int n = x.size(-1);
    layernorm_fwd_{i}<__nv_bfloat16><<<x.size(0), 256, 0, stream>>>(
        (const __nv_bfloat16*)x.data_ptr(), (__nv_bfloat16*)y.data_ptr(), nullptr, n);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw std::runtime_error(cudaGetErrorString(err));
}}
''',
    '''
void gemm_{i}(cublasHandle_t handle, const float* a, const float* b, float* c, int m, int n, int k) {{
    const float alpha = 1.f, beta = 0.f;
    cublasStatus_t st = cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a, m, b, k, &beta, c, m);
    if (st != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublas failed");
    float* host = (float*)malloc(sizeof(float) * m * n);
    cudaMemcpy(host, c, sizeof(float) * m * n, cudaMemcpyDeviceToHost);
    free(host);
}}
''',
    '''
void allreduce_{i}(float* buf, size_t count, ncclComm_t comm, cudaStream_t s) {{
    ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, s);
    cudaStreamSynchronize(s);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // Ampere and newer only
#endif
}}
''',
    '''
static int plain_helper_{i}(const std::vector<int>& v) {{
    int total = 0;
    for (int x : v) total += x * {i};
    return total;
}}
''',
]


def make_tree(root: Path, n_py: int, n_cu: int, n_plain: int, rng: random.Random) -> dict:
    counts = {"python": 0, "cuda": 0, "plain": 0, "lines": 0}
    for i in range(n_py):
        parts = [PY_HEAD.format(i=i)]
        for j in range(rng.randint(70, 200)):            # 1-3k lines
            parts.append(rng.choice(PY_BLOCKS).format(i=f"{i}_{j}"))
        _write(root / f"pkg{i % 8}" / f"train_{i}.py", parts, counts, "python")
    for i in range(n_cu):
        parts = [CU_HEAD.format(i=i)]
        for j in range(rng.randint(90, 180)):            # 1-2k lines
            parts.append(rng.choice(CU_BLOCKS).format(i=f"{i}_{j}"))
        _write(root / "csrc" / f"kernels_{i}.cu", parts, counts, "cuda")
    for i in range(n_plain):
        parts = ['"""Utilities."""\nimport os\n'] + [PLAIN.format(i=f"{i}_{j}") for j in range(rng.randint(30, 120))]
        _write(root / "utils" / f"util_{i}.py", parts, counts, "plain")
    return counts


def _write(path: Path, parts, counts, kind) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(parts)
    path.write_text(text)
    counts[kind] += 1
    counts["lines"] += text.count("\n")


def startup_seconds(repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "opscope.app", "migrate", "scan", "--help"], capture_output=True,
                       check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "cuda-samples"


def bench_rewrite(repeat: int, hipify_perl: str | None, perl_limit: float = 120) -> None:
    """apply's C/C++ rewrite vs hipify-perl, both over every file of the cuda-samples corpus."""
    import shutil
    from opscope.app.migrate.c_rewrite import rewrite_c
    from opscope.app.migrate.rules import default_table
    files = sorted(p for p in CORPUS.rglob("*") if p.suffix in (".cu", ".cpp", ".h", ".cuh"))
    texts = [p.read_text() for p in files]
    lines = sum(t.count("\n") for t in texts)
    table = default_table()
    inproc = []
    for _ in range(repeat):
        t = time.perf_counter()
        for p, text in zip(files, texts):
            rewrite_c(p.name, text, table)
        inproc.append(time.perf_counter() - t)
    ours = statistics.median(inproc)
    print(f"C/C++ corpus: {len(files)} files, {lines:,} lines (tests/data/cuda-samples: Samples/, Common/)")
    print(f"migrate apply rewrite, in process: {ours:.3f} s  {lines / ours:,.0f} lines/s")
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp, "t")
        cmd_times = []
        for _ in range(repeat):
            shutil.rmtree(tree, ignore_errors=True)
            shutil.copytree(CORPUS, tree)
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "opscope.app", "migrate", "apply", str(tree), "--write", "--json"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            cmd_times.append(time.perf_counter() - t)
    cmd = statistics.median(cmd_times)
    print(f"`opscope migrate apply --write` command: {cmd:.2f} s  {lines / cmd:,.0f} lines/s")
    if not hipify_perl or not shutil.which("perl"):
        print("hipify-perl: not compared (give --hipify-perl PATH, and perl on PATH)")
        return
    # per file, with a limit: hipify-perl's recursive launch patterns can take minutes on one header
    done, perl_total = [], 0.0
    for p, text in zip(files, texts):
        t = time.perf_counter()
        try:
            subprocess.run(["perl", hipify_perl, str(p)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=perl_limit)
        except subprocess.TimeoutExpired:
            print(f"hipify-perl: {p.name} past {perl_limit:g} s, left out of both sides")
            continue
        perl_total += time.perf_counter() - t
        done.append((p, text))
    if not done:
        return
    n = sum(text.count("\n") for _, text in done)
    t = time.perf_counter()
    for p, text in done:
        rewrite_c(p.name, text, table)
    mine = time.perf_counter() - t
    print(f"on the {len(done)} files hipify-perl finished ({n:,} lines): opscope {n / mine:,.0f} lines/s, "
          f"hipify-perl {n / perl_total:,.1f} lines/s (one command per file, as hipconvertinplace runs it)")
    print(f"lines/s ratio, opscope / hipify-perl: {perl_total / mine:,.0f}x in process")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller tree")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hipify-perl", default=os.environ.get("HIPIFY_PERL"),
                    help="hipify-perl to compare the C/C++ rewrite with (github.com/ROCm/HIPIFY bin/hipify-perl; "
                         "default $HIPIFY_PERL)")
    a = ap.parse_args()
    bench_rewrite(a.repeat, a.hipify_perl)
    n_py, n_cu, n_plain = (12, 6, 6) if a.quick else (120, 60, 40)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        counts = make_tree(root, n_py, n_cu, n_plain, random.Random(0))
        files = counts["python"] + counts["cuda"] + counts["plain"]
        print(f"tree: {files} files ({counts['python']} CUDA-heavy Python, {counts['cuda']} C++/CUDA, "
              f"{counts['plain']} plain Python), {counts['lines']:,} lines")
        print(f"start-up (`opscope migrate scan --help`): {startup_seconds(a.repeat):.2f} s")
        jobs_list = [1, 2]
        times: dict[int, list[float]] = {j: [] for j in jobs_list}
        findings = {}
        for _ in range(a.repeat):                          # interleaved: machine noise hits both alike
            for jobs in jobs_list:
                t = time.perf_counter()
                r = scan_path(root, jobs=jobs)
                times[jobs].append(time.perf_counter() - t)
                findings[jobs] = len(r.findings)
        for jobs in jobs_list:
            med = statistics.median(times[jobs])
            print(f"--jobs {jobs}: {med:.2f} s  {files / med:,.0f} files/s  {counts['lines'] / med:,.0f} lines/s  "
                  f"({findings[jobs]:,} findings)")
        print(f"--jobs 2 / --jobs 1 time: {statistics.median(times[2]) / statistics.median(times[1]):.2f}x")


if __name__ == "__main__":
    main()
