"""opscope migrate: scan a planted corpus, rewrite it, run the rewritten scripts on the CPU.

Every planted API carries a `PLANT category` marker comment on its line; the expected findings
are read from those markers, so a missed API and a false alarm both fail the same assertion.
Decoys (comments, docstrings, unrelated strings) sit between them.
"""
from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from opscope.app.migrate.c_scan import blank
from opscope.app.migrate.scan import scan_path

TRAIN = '''"""Train a tiny model. Mentions torch.cuda.synchronize() and model.cuda() in the docstring only."""
import torch
import torch.nn as nn

DEVICE = "cuda"  # PLANT device
# model.cuda() and torch.cuda.memory_allocated() in a comment are not code


def main():
    torch.manual_seed(0)
    torch.cuda.manual_seed(0)  # PLANT random
    torch.backends.cudnn.benchmark = True  # PLANT cudnn
    torch.backends.cudnn.deterministic = False  # PLANT cudnn
    print("training with cuda if you have one", "cuda kernels")
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).cuda()  # PLANT device
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.cuda.amp.GradScaler()  # PLANT amp
    x = torch.randn(32, 8, device="cuda")  # PLANT device
    y = torch.randn(32, 1).to(DEVICE)  # PLANT device
    for step in range(3):
        opt.zero_grad()
        with torch.cuda.amp.autocast():  # PLANT amp
            loss = nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    torch.cuda.synchronize()  # PLANT sync
    print("allocated", torch.cuda.memory_allocated(), "peak", torch.cuda.max_memory_allocated())  # PLANT memory
    print("OK", float(loss))


if __name__ == "__main__":
    main()
'''

AMP = '''import os

import torch
from torch import nn

rank = int(os.environ.get("RANK", "0"))
device = f"cuda:{rank}"  # PLANT device
dev2 = torch.device("cuda", rank)  # PLANT device
print(f"cuda is fast, device {rank}")
label = "cuda" in os.environ.get("NOTE", "")


def run():
    if not torch.cuda.is_available():  # PLANT device
        print("no GPU visible; count", torch.cuda.device_count())  # PLANT device
    model = nn.Linear(4, 2).to(device)  # PLANT device
    x = torch.randn(3, 4).cuda(rank, non_blocking=True)  # PLANT device
    scaler = torch.amp.GradScaler("cuda")  # PLANT amp
    with torch.autocast("cuda", dtype=torch.float16):  # PLANT amp
        out = model(x.to(dev2))  # PLANT device
    with torch.autocast("cpu", enabled=False):
        pass
    scaler.scale(out.float().sum()).backward()
    print("OK", tuple(out.shape))


run()
'''

DDP = '''import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    store = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp.store")   # the store file goes at exit
    dist.init_process_group("nccl", init_method="file://" + store, rank=0, world_size=1)  # PLANT distributed
    try:
        torch.cuda.set_device(0)  # PLANT device
        model = DDP(torch.nn.Linear(4, 4).cuda(), device_ids=[0], output_device=0)  # PLANT device,distributed
        loss = model(torch.randn(2, 4, device="cuda:0")).sum()  # PLANT device
        loss.backward()
        t = torch.ones(1).cuda()  # PLANT device
        dist.all_reduce(t)
        print("OK", t.item())
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''

# never says cuda: DDP's device_ids alone make it fail off CUDA (and get it scanned)
DDP_GLOO = '''"""DistributedDataParallel(model, device_ids=[rank]) in a docstring is not code."""
import argparse
import os

import torch
import torch.distributed as dist


def wrap(model, device_ids=None, output_device=None):
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    store = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gloo.store")
    dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
    try:
        # DDP(model, device_ids=[rank]) in a comment is not code
        print("on GPUs pass device_ids=[rank] to DistributedDataParallel")
        net = wrap(torch.nn.Linear(4, 4), device_ids=[0], output_device=0)
        model = torch.nn.parallel.DistributedDataParallel(
            net,  # one replica per process
            device_ids=[args.local_rank],  # PLANT distributed
            output_device=args.local_rank,  # PLANT distributed
        )
        model(torch.randn(2, 4)).sum().backward()
        print("OK", tuple(net.weight.grad.shape))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''

LIBS = '''import cupy as cp  # PLANT library
from numba import cuda  # PLANT library
import triton  # PLANT library
import torch


@triton.jit  # PLANT library
def kernel(x):
    pass


@cuda.jit  # PLANT library
def k2(a):
    pass


def timed():
    s = torch.cuda.Stream()  # PLANT streams
    start = torch.cuda.Event(enable_timing=True)  # PLANT streams
    g = torch.cuda.CUDAGraph()  # PLANT streams
    torch.cuda.nvtx.range_push("x")  # PLANT other
'''

KERNEL = '''// cudaMalloc and cudaFree in a line comment are not calls
#include <cuda_runtime.h>  // PLANT headers
#include "cublas_v2.h"  // PLANT headers
/* cudaMemcpy(dst, src, n, kind) in a block comment,
   over two lines: cudaStreamCreate(&s) */

__global__ void scale(float *a, float k, int n) {  // PLANT kernel
    int i = blockIdx.x * blockDim.x + threadIdx.x;  // PLANT kernel
    if (i < n) a[i] *= k;
}

int main() {
    const char *msg = "cudaMalloc(&p, 4) inside a string";
    float *d = 0, h[256];
    cudaMalloc(&d, sizeof(h));  // PLANT memory
    cudaMemcpy(d, h, sizeof(h), cudaMemcpyHostToDevice);  // PLANT memory
    cudaStream_t st;  // PLANT streams
    cudaStreamCreate(&st);  // PLANT streams
    cudaEvent_t ev;  // PLANT streams
    cudaEventCreate(&ev);  // PLANT streams
    scale<<<1, 256, 0, st>>>(d, 2.0f, 256);  // PLANT kernel-launch
    cudaEventRecord(ev, st);  // PLANT streams
    cudaMemcpyAsync(h, d, sizeof(h), cudaMemcpyDeviceToHost,  // PLANT memory
                    st);
    cudaDeviceSynchronize();  // PLANT sync
    cublasSgemm(handle, 0, 0, 1, 1, 1, 0, 0, 1, 0, 1, 0, 0, 1);  // PLANT library
    cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);  // PLANT kernel-launch
    ncclAllReduce(d, d, 256, ncclFloat, ncclSum, comm, st);  // PLANT distributed
    cudaFree(d);  // PLANT memory
    return 0;
}
'''

CORPUS = {"train.py": TRAIN, "pkg/amp_train.py": AMP, "pkg/ddp.py": DDP, "pkg/ddp_gloo.py": DDP_GLOO, "libs.py": LIBS,
          "csrc/kernel.cu": KERNEL}
RUNNABLE = ["train.py", "pkg/amp_train.py", "pkg/ddp.py", "pkg/ddp_gloo.py"]


def planted(files: dict) -> set[tuple[str, int, str]]:
    out = set()
    for name, text in files.items():
        for i, line in enumerate(text.splitlines(), 1):
            m = re.search(r"PLANT ([\w,-]+)", line)
            if m:
                out |= {(name, i, c) for c in m.group(1).split(",")}
    return out


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "project"
    for name, text in CORPUS.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_scan_finds_every_planted_api_on_its_line_and_nothing_else(corpus):
    result = scan_path(corpus)
    found = {(f.file, f.line, f.category) for f in result.findings}
    expected = planted(CORPUS)
    assert found - expected == set(), "false alarms"
    assert expected - found == set(), "missed"
    assert not result.skipped


def test_findings_carry_column_api_severity_and_replacement(corpus):
    by_api = {(f.file, f.api): f for f in scan_path(corpus).findings}
    cuda_call = next(f for (file, api), f in by_api.items() if file == "train.py" and api == ".cuda()")
    line = TRAIN.splitlines()[cuda_call.line - 1]
    assert line[cuda_call.column - 1:].startswith("cuda()")
    sync = by_api[("train.py", "torch.cuda.synchronize")]
    assert (sync.severity, sync.replacement, sync.rewritable) == ("info", "compat.synchronize()", True)
    malloc = by_api[("csrc/kernel.cu", "cudaMalloc")]
    assert (malloc.line, malloc.column, malloc.severity, malloc.language) == (15, 5, "error", "c")
    assert by_api[("libs.py", "import cupy")].severity == "error"
    var = [f for f in by_api.values() if f.api == "device variable DEVICE"]
    assert var and "line 5" in var[0].note
    ddp = by_api[("pkg/ddp_gloo.py", "torch.nn.parallel.DistributedDataParallel(device_ids=[args.local_rank])")]
    assert DDP_GLOO.splitlines()[ddp.line - 1][ddp.column - 1:].startswith("device_ids=[args.local_rank],")
    assert (ddp.category, ddp.severity, ddp.rewritable) == ("distributed", "info", True)
    assert ddp.replacement.startswith("leave device_ids out")
    assert ("pkg/ddp.py", "torch.nn.parallel.DistributedDataParallel(output_device=0)") in by_api   # through `as DDP`


def test_c_blanking_keeps_positions():
    text = 'a = "x/*y*/"; // c\n/* multi\nline */ b(\'"\');\n'
    out = blank(text)
    assert len(out) == len(text) and out.count("\n") == text.count("\n")
    assert "x" not in out and "c" not in out.replace("\n", "") and "b(" in out


@pytest.mark.slow
@pytest.mark.multiprocess
def test_apply_write_rewrites_scripts_that_then_run_on_cpu(corpus, cli):
    r = cli("migrate", "apply", corpus, "--write")
    assert r.returncode == 0, r.stderr
    for name in RUNNABLE:
        assert (corpus / (name + ".orig")).read_text() == CORPUS[name]
        new = (corpus / name).read_text()
        uses_compat = "compat." in new.replace("from opscope.app.migrate import compat", "")
        assert new.count("from opscope.app.migrate import compat") == uses_compat      # once, and only where used
        code = "\n".join(ln for ln in new.splitlines() if not ln.lstrip().startswith(("#", '"""')))
        assert "torch.cuda" not in code and ".cuda(" not in code and '"nccl"' not in code
    train = (corpus / "train.py").read_text()
    assert "# model.cuda() and torch.cuda.memory_allocated() in a comment are not code" in train   # comments kept
    assert "# opscope-migrate: torch.backends.cudnn.benchmark is a no-op off CUDA\n    torch.backends.cudnn.benchmark" \
        in train
    libs = (corpus / "libs.py").read_text()
    assert "# opscope-migrate: torch.cuda.Stream: no automatic rewrite" in libs
    assert "# opscope-migrate: import cupy: no automatic rewrite" in libs
    # C/C++/CUDA is rewritten to HIP (issue 29), comments and strings left as written; the original is kept
    kernel = (corpus / "csrc/kernel.cu").read_text()
    assert (corpus / "csrc/kernel.cu.orig").read_text() == KERNEL
    assert "#include <hip/hip_runtime.h>" in kernel and "cudaMalloc and cudaFree in a line comment" in kernel
    assert '"cudaMalloc(&p, 4) inside a string"' in kernel
    gloo = (corpus / "pkg/ddp_gloo.py").read_text()
    assert "DistributedDataParallel(\n            net,  # one replica per process\n        )\n" in gloo
    assert "compat" not in gloo and "wrap(torch.nn.Linear(4, 4), device_ids=[0], output_device=0)" in gloo
    assert "model = DDP(torch.nn.Linear(4, 4).to(compat.device()))  # PLANT device,distributed" \
        in (corpus / "pkg/ddp.py").read_text()
    env = {"CUDA_VISIBLE_DEVICES": "", "OPSCOPE_DEVICE": "cpu"}
    import os
    for name in RUNNABLE:
        run = subprocess.run([sys.executable, str(corpus / name)], capture_output=True, text=True, timeout=120,
                             env={**os.environ, **env}, cwd=corpus)
        assert run.returncode == 0, f"{name}: {run.stderr[-2000:]}"
        assert "OK" in run.stdout
    assert not list(corpus.rglob("*.store"))          # the DDP scripts' process-group files are gone
    # a second apply has nothing left to change
    again = cli("migrate", "apply", corpus, "--diff")
    assert again.returncode == 0 and again.stdout == ""


@pytest.mark.multiprocess
def test_the_original_scripts_do_not_run_on_cpu(corpus):
    """The rewrite test means something only if the originals fail here."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    run = subprocess.run([sys.executable, str(corpus / "train.py")], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0


@pytest.mark.multiprocess
def test_ddp_device_ids_fail_for_a_cpu_module_until_apply_drops_them(corpus):
    """DDP refuses device_ids/output_device for a CPU module, GPU or not; the apply test runs the rewrite."""
    run = subprocess.run([sys.executable, str(corpus / "pkg/ddp_gloo.py")], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0 and "device_ids and output_device arguments only work" in run.stderr
    assert not list(corpus.rglob("*.store"))


def test_apply_diff_prints_a_unified_diff_and_changes_nothing(corpus, cli):
    r = cli("migrate", "apply", corpus / "pkg" / "amp_train.py")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("--- a/amp_train.py\n+++ b/amp_train.py\n")
    assert '-device = f"cuda:{rank}"' in r.stdout and "+device = compat.device_string(rank)" in r.stdout
    assert "+dev2 = compat.device(rank)" in r.stdout
    assert "+    x = torch.randn(3, 4).to(compat.device(rank), non_blocking=True)" in r.stdout
    assert "+    with compat.autocast(dtype=torch.float16):" in r.stdout
    assert '    with torch.autocast("cpu", enabled=False):' not in [ln for ln in r.stdout.splitlines()
                                                                   if ln.startswith(("+", "-"))]
    assert (corpus / "pkg" / "amp_train.py").read_text() == AMP
    assert not (corpus / "pkg" / "amp_train.py.orig").exists()


def test_parse_errors_binary_and_huge_files_do_not_stop_the_scan(corpus, cli):
    (corpus / "broken.py").write_text("import torch\ndef f(:\n    torch.cuda.synchronize()\n")
    (corpus / "broken2.py").write_text("x = 1\nclass (:\n")          # no CUDA words: checked by the fast parser
    (corpus / "blob.py").write_bytes(b"torch.cuda\0\x01\x02" * 10)
    (corpus / "huge.py").write_text("x = 'cuda'\n" * 400)
    r = cli("migrate", "scan", corpus, "--json", "--max-size", "2KiB")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    errors = {(f["file"], f["line"]) for f in doc["findings"] if f["category"] == "parse-error"}
    assert errors == {("broken.py", 2), ("broken2.py", 2)}
    skipped = {s["file"]: s["reason"] for s in doc["skipped"]}
    assert set(skipped) == {"blob.py", "huge.py"}
    assert "binary" in skipped["blob.py"] and "size limit" in skipped["huge.py"]
    assert {f["file"] for f in doc["findings"]} >= {"train.py", "csrc/kernel.cu"}     # the rest was scanned


def test_json_csv_and_html_reports_are_valid(corpus, cli, tmp_path):
    r = cli("migrate", "scan", corpus, "--json")
    doc = json.loads(r.stdout)
    n = len(planted(CORPUS))
    assert doc["findings_total"] >= n and len(doc["findings"]) == doc["findings_total"]
    assert 0 <= doc["readiness"] < 100 and doc["files_scanned"] == len(CORPUS)
    cats = {c["category"]: c for c in doc["by_category"]}
    streams = [f for f in doc["findings"] if f["category"] == "streams"]
    assert all(not f["resolved"] for f in streams if f["language"] == "python") and cats["amp"]["unresolved"] == 0
    assert all(f["resolved"] for f in streams if f["language"] == "c")       # apply renames them to hipStream*
    assert sum(f["findings"] for f in doc["by_file"]) == doc["findings_total"]

    r = cli("migrate", "scan", corpus, "--csv")
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == doc["findings_total"] and rows[0].keys() >= {"file", "line", "column", "api", "severity"}

    out = tmp_path / "report.html"
    r = cli("migrate", "scan", corpus, "--html", "-o", out)
    assert r.returncode == 0, r.stderr
    page = out.read_text()

    class Check(HTMLParser):
        tags, external = [], []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            self.external += [v for k, v in attrs if k in ("src", "href") and v]

    p = Check()
    p.feed(page)
    assert p.external == [] and "script" not in p.tags and "link" not in p.tags
    assert "http://" not in page and "https://" not in page
    assert "cudaMemcpyAsync" in page and f"{doc['readiness']:.1f}" in page


def test_readiness_score_rises_after_apply(corpus, cli):
    before = json.loads(cli("migrate", "scan", corpus, "--json").stdout)
    cli("migrate", "apply", corpus, "--write")
    after = json.loads(cli("migrate", "scan", corpus, "--json").stdout)
    # what apply cannot do is still reported (C/C++ names with a HIP spelling are rewritten now)
    assert 0 < after["unresolved"] <= before["unresolved"]
    assert after["readiness"] > before["readiness"]
    assert all(f["category"] not in ("amp", "random", "sync") for f in after["findings"] if f["file"] == "train.py")
    pkg = json.loads(cli("migrate", "scan", corpus / "pkg", "--json").stdout)
    assert pkg["findings_total"] == 0 and pkg["readiness"] == 100.0    # pkg/ needed nothing manual


@pytest.mark.parametrize("argv, message", [
    (["scan", "/no/such/path"], "does not exist"),
    (["scan", ".", "--html"], "--html needs -o"),
    (["scan", ".", "--json", "-o", "/no/such/folder/r.json"], "does not exist"),
    (["apply", "/no/such/path"], "does not exist"),
    (["scan", ".", "--max-size", "lots"], "--max-size"),
])
def test_bad_input_is_one_line_exit_2(cli, argv, message):
    r = cli("migrate", *argv)
    assert r.returncode == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


MODEL = '''import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.fc1(x))
        return self.fc2(h).softmax(-1)


def factory():
    torch.manual_seed(0)
    return Net(), (torch.randn(2, 8),)
'''

STRICT = '''[backend]
name = "strict-npu"
implementation = "numpy"

[hardware]
peak_flops = { float32 = 1.0e12 }
memory_bandwidth = 1.0e11
memory_capacity = 1.0e9
launch_overhead = 1.0e-6

[operators]
unsupported = ["gelu"]
'''


@pytest.mark.multiprocess
@pytest.mark.slow
def test_check_predicts_native_fallback_unsupported_and_a_run_confirms_it(tmp_path, cli):
    (tmp_path / "m.py").write_text(MODEL)
    (tmp_path / "strict.toml").write_text(STRICT)
    r = cli("migrate", "check", f"{tmp_path / 'm.py'}:factory", "-b", "numpy", "-b", "sim:npu-a1",
            "-b", tmp_path / "strict.toml", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["confirmed"] is True
    numpy_, npu, strict = doc["backends"]
    assert numpy_["counts"] == {"native": 4, "fallback": 0, "missing-op": 0, "unsupported": 0}
    assert numpy_["run"]["matched"]
    gelu = {o["op"]: o for o in npu["ops"]}["gelu"]
    assert (gelu["status"], gelu["runs_on"]) == ("fallback", "numpy")
    assert npu["run"]["ran"] and npu["run"]["matched"] and npu["run"]["numerics_ok"]
    line = next(d for d in npu["lines"] if d["status"] != "native")
    assert line["source"].endswith("m.py:12") and "gelu" in line["ops"]
    assert {o["op"]: o["status"] for o in strict["ops"]}["gelu"] == "unsupported"
    assert not strict["run"]["ran"] and strict["run"]["refused_ops"] == ["gelu"] and strict["run"]["matched"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_check_tells_a_missing_opscope_op_from_a_backend_that_cannot_run_it(tmp_path, cli):
    """A library's custom op: opscope has no op for it (numpy cannot run it: work for opscope), torch:cpu runs it.
    The factory prints, and --json stdout is still one JSON document."""
    from pathlib import Path
    src = (Path(__file__).parent / "models" / "custom_op.py").read_text()
    (tmp_path / "m.py").write_text(src.replace("def factory():\n", "def factory():\n    print('loading weights')\n"))
    r = cli("migrate", "check", f"{tmp_path / 'm.py'}:factory", "-b", "numpy", "-b", "torch:cpu", "--json")
    doc = json.loads(r.stdout)                     # the model's print went to stderr
    assert "loading weights" in r.stderr
    numpy_, torch_cpu = doc["backends"]
    gate = {o["op"]: o for o in numpy_["ops"]}["opscopetest:scaled_gate"]
    assert gate["status"] == "missing-op" and numpy_["counts"]["missing-op"] == 1
    assert numpy_["counts"]["unsupported"] == 0
    assert {o["op"]: o["status"] for o in torch_cpu["ops"]}["opscopetest:scaled_gate"] == "native"
    assert torch_cpu["run"]["ran"] and torch_cpu["run"]["matched"]


@pytest.mark.multiprocess
def test_scanning_does_not_import_torch(corpus):
    code = ("import sys\nimport opscope.app.cli as c\nsys.argv = ['opscope', 'migrate', 'scan', sys.argv[1], '--json']\n"
            "try:\n    c.main()\nexcept SystemExit:\n    pass\n"
            "print('torch imported' if 'torch' in sys.modules else 'no torch', file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code, str(corpus)], capture_output=True, text=True, timeout=120)
    assert json.loads(r.stdout)["findings_total"] > 0
    assert r.stderr.strip().endswith("no torch")


@pytest.mark.multiprocess
def test_jobs_scan_in_parallel_with_the_same_findings(corpus, tmp_path):
    import shutil
    tree = tmp_path / "tree"
    for i in range(40):                       # more files than one worker's chunk
        shutil.copytree(corpus, tree / f"copy{i}")
    one = scan_path(tree)
    two = scan_path(tree, jobs=2)
    key = lambda r: [(f.file, f.line, f.column, f.api, f.hip) for f in r.findings]  # noqa: E731
    assert key(one) == key(two) and len(one.findings) > 40 * 10
    assert one.files == two.files and one.skipped == two.skipped


@pytest.mark.multiprocess
@pytest.mark.slow
def test_check_train_predicts_the_backward_and_optimizer_ops_and_a_step_confirms_it(tmp_path, cli):
    """A chip without relu's backward: the training check finds it in the backward phase, predicts the
    fallback for exactly that op, and one real step (loss vs eager) confirms it."""
    (tmp_path / "nobwd.toml").write_text(STRICT.replace('name = "strict-npu"', 'name = "no-relu-bwd"')
                                         .replace('implementation = "numpy"', 'implementation = "sim"\nfallback = "numpy"')
                                         .replace('unsupported = ["gelu"]', 'unsupported = ["threshold_backward"]'))
    r = cli("migrate", "check", "demo:mlp", "--train", "-b", "numpy", "-b", tmp_path / "nobwd.toml", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["train"] is True and doc["confirmed"] is True
    numpy_, chip = doc["backends"]
    assert set(numpy_["phases"]) == {"forward", "backward", "optimizer"}
    assert numpy_["counts"]["fallback"] == 0 and numpy_["run"]["ran"] and numpy_["run"]["numerics_ok"]
    ops = {o["op"]: o for o in chip["ops"]}
    assert (ops["threshold_backward"]["status"], ops["threshold_backward"]["runs_on"]) == ("fallback", "numpy")
    assert [o["op"] for o in chip["ops"] if o["status"] != "native"] == ["threshold_backward"]
    assert chip["phases"]["backward"]["fallback"] == chip["counts"]["fallback"] > 0
    assert chip["run"]["matched"] and abs(chip["run"]["loss"] - chip["run"]["eager_loss"]) < 1e-4


CPP_EXT = '''#include <cuda_runtime.h>
#include <nccl.h>
#include <ATen/cuda/CUDAContext.h>
#include <nvtx3/nvToolsExt.h>
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#endif
__device__ inline float load(const float* x) { return __ldcs(x); }
void step(torch::Tensor x, ncclComm_t comm) {
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
  if (torch::cuda::is_available()) { auto kind = torch::kCUDA; }
  cudaStream_t s = at::cuda::getCurrentCUDAStream();
  __nv_bfloat16 b; int t = CUDA_R_16BF; int ok = CUBLAS_STATUS_SUCCESS;
  if (cudaMemcpyAsync(0, 0, 4, cudaMemcpyDeviceToHost, s) != cudaSuccess) {}
  nvtxRangePushA("step");
}
'''


def test_c_scan_finds_headers_types_intrinsics_macros_nvtx_and_the_libtorch_device_api(tmp_path):
    (tmp_path / "ext.cu").write_text(CPP_EXT)
    found = {f.api: f for f in scan_path(tmp_path).findings}
    want_hip = {"#include cuda_runtime.h": "hip/hip_runtime.h", "#include nccl.h": "rccl/rccl.h",
                "cudaStream_t": "hipStream_t", "cudaMemcpyAsync": "hipMemcpyAsync", "cudaSuccess": "hipSuccess",
                "cudaMemcpyDeviceToHost": "hipMemcpyDeviceToHost", "CUDA_R_16BF": "HIP_R_16BF",
                "CUBLAS_STATUS_SUCCESS": "HIPBLAS_STATUS_SUCCESS", "__nv_bfloat16": "__hip_bfloat16",
                "__ldcs": "__builtin_nontemporal_load"}
    for api, hip in want_hip.items():
        assert api in found, api
        assert found[api].hip == hip, (api, found[api].hip)
    for api in ("#include ATen/cuda/CUDAContext.h", "#include nvtx3/nvToolsExt.h", "__CUDA_ARCH__", "__device__",
                "ncclComm_t", ".is_cuda()", "torch::cuda::is_available", "torch::kCUDA",
                "at::cuda::getCurrentCUDAStream", "nvtxRangePushA"):
        assert api in found and found[api].hip and found[api].sycl, api
    assert found["torch::kCUDA"].sycl == "torch::kXPU"
    lines = CPP_EXT.splitlines()
    for f in found.values():                                   # every finding sits on the line it names
        assert f.api.split()[-1].strip(".()").split("::")[-1] in lines[f.line - 1], f


CANCELLING = '''import torch
from torch import nn


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 256)

    def forward(self, x):
        return self.fc(x).sum()            # a sum that cancels: rounding each product shows in it


def factory():
    torch.manual_seed(0)
    return Wide(), (torch.randn(64, 256) * 3,)
'''
LOW_PRECISION = '''
[backend]
name = "lowp-chip"
implementation = "sim"
fallback = "numpy"

[hardware]
peak_flops = { float32 = 1.0e13, float16 = 4.0e13 }
memory_bandwidth = 1.0e12

[operators]
low_precision = ["addmm", "matmul", "linear"]
'''


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("json_out", [False, True])
def test_check_says_in_one_line_why_it_exits_1_and_shows_time_per_op(tmp_path, cli, json_out):
    """A chip that rounds matmuls to float16: placement matches, the loss does not. `migrate check` exited 1 with
    nothing on stderr after printing 'placement matched'; now one line says the loss is beyond the tolerance, and
    each op's roofline estimate stands beside the time the run measured, with its clock."""
    (tmp_path / "m.py").write_text(CANCELLING)
    (tmp_path / "lowp.toml").write_text(LOW_PRECISION)
    r = cli("migrate", "check", f"{tmp_path / 'm.py'}:factory", "--train", "-b", tmp_path / "lowp.toml",
            *(["--json"] if json_out else []))
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "not confirmed" in lines[0] and "beyond the tolerance" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    if json_out:
        doc = json.loads(r.stdout)
        assert not doc["confirmed"] and "beyond the tolerance" in doc["why_not"]
        times = doc["backends"][0]["run"]["times"]
        addmm = next(t for t in times if t["op"] in ("addmm", "matmul"))
        assert addmm["predicted_clock"] == "estimate: roofline" and addmm["measured_clock"] == "simulated"
        assert addmm["predicted_seconds"] > 0 and addmm["measured_seconds"] > 0
    else:
        assert "OUTSIDE the tolerance" in r.stdout and "time per op" in r.stdout and "simulated" in r.stdout
