"""`migrate apply` never changes what a script means (issue 29): a device passed in stays passed in, an int
device is an accelerator number, a build file gets suggestions and no opscope import, and the Python blind
spots (torch.version.cuda, is_nccl_available, torch.cuda.nccl) are findings."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import venv

import pytest
import torch

from opscope.app.migrate import compat
from opscope.app.migrate.scan import scan_path

# Megatron-LM's RNG helper (megatron/core/tensor_parallel/random.py, _set_cuda_rng_state), its device logic as written
RNG = '''import torch


def pick(device=-1):
    if device == -1:
        device = torch.device('cuda')
    elif isinstance(device, str):
        device = torch.device(device)
    elif isinstance(device, int):
        device = torch.device('cuda', device)
    return device


def by_rank(local_rank):
    return torch.device(local_rank)


def put(x):
    device = 0
    torch.cuda.set_device(device)
    return x.to(device).device, torch.zeros(2, device=device).device, x.to(0).device
'''
VALUES = ["cpu", "cuda", "cuda:1", 0, 1, torch.device("cpu"), torch.device("cuda", 1), torch.device("meta"), None]


def _apply(tmp_path, files: dict[str, str], *extra) -> dict:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    r = subprocess.run([sys.executable, "-m", "opscope.app", "migrate", "apply", str(tmp_path), "--write", "--json",
                        *extra], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _load(path, name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _on_cuda_machine(v):
    """What torch.device(v) is on a CUDA machine, mapped the way opscope maps CUDA: the chosen type, same index."""
    d = torch.device("cuda", v) if isinstance(v, int) else torch.device(v)
    if d.type != "cuda":
        return d
    chosen = compat._chosen()
    return chosen if chosen.type == "cpu" or d.index is None else torch.device(chosen.type, d.index)


@pytest.mark.parametrize("chosen", ["cpu", "meta"])       # meta: a non-CPU device with indices, no hardware needed
def test_compat_device_maps_only_cuda_naming_values(monkeypatch, chosen):
    monkeypatch.setenv(compat.ENV, chosen)
    for v in VALUES:
        if v is None:
            assert compat.device(v) == compat._chosen()           # .cuda() / .cuda(None): the current accelerator
            continue
        assert compat.device(v) == _on_cuda_machine(v), v
    assert compat.device("cuda", 1) == _on_cuda_machine(torch.device("cuda", 1))
    assert compat.device("cpu") == torch.device("cpu")            # was: the accelerator, on an XPU machine
    with pytest.raises(TypeError):
        compat.device(torch.float16)                              # not a device: refused, never guessed


@pytest.mark.multiprocess
@pytest.mark.parametrize("chosen", ["cpu", "meta"])
def test_torch_device_of_a_variable_keeps_its_argument(tmp_path, monkeypatch, chosen):
    doc = _apply(tmp_path, {"rng.py": RNG})
    after = (tmp_path / "rng.py").read_text()
    assert "compat.device(device)" in after and "compat.device(local_rank)" in after
    assert doc["rewritten"] >= 6
    (tmp_path / "orig").mkdir()
    (tmp_path / "orig" / "rng.py").write_text(RNG)
    monkeypatch.setenv(compat.ENV, chosen)
    old = _load(tmp_path / "orig" / "rng.py", f"rng_before_{chosen}")
    new = _load(tmp_path / "rng.py", f"rng_after_{chosen}")
    for v in VALUES:
        if v is None:
            continue
        # before: the original on a CUDA machine (torch.device(int) is cuda:int there), mapped to the chosen device
        # a torch.device falls through pick's branches: it is returned as passed, before and after
        want = old.pick(v) if isinstance(v, torch.device) else _on_cuda_machine(old.pick(v))
        assert new.pick(v) == want, v                          # 'cpu' stays cpu, 'cuda:1' keeps index 1
        assert new.by_rank(v) == _on_cuda_machine(v), v
    assert new.pick() == _on_cuda_machine(old.pick())
    x = torch.ones(2)
    if chosen == "cpu":
        assert new.put(x) == (torch.device("cpu"),) * 3         # the original fails here: no accelerator 0


def test_int_devices_and_blind_spots_are_findings(tmp_path):
    (tmp_path / "t.py").write_text(
        "import os\nimport torch\nimport torch.distributed as dist\nimport torch.cuda.nccl\n"
        "class T:\n    def __init__(self, m):\n        self.gpu_id = int(os.environ['LOCAL_RANK'])\n"
        "        self.m = m.to(self.gpu_id)\n"
        "print(torch.version.cuda, dist.is_nccl_available())\n"
        "def f(x, rank):\n    torch.cuda.set_device(rank)\n    n = 3\n    return x.to(rank), x.to(n), torch.device(rank)\n")
    found = {(f.line, f.api): f for f in scan_path(tmp_path).findings}
    apis = [a for _, a in found]
    assert "import torch.cuda.nccl" in apis and "torch.version.cuda" in apis
    assert "torch.distributed.is_nccl_available" in apis
    assert any("self.gpu_id" in a for a in apis) and any(a.startswith("device rank") for a in apis)
    assert not any(a.startswith("device n") for a in apis)     # an int that is not named like a device
    assert any(a == "torch.device(rank)" for a in apis) and "torch.cuda.set_device" in apis


def test_readiness_says_it_is_not_verified(tmp_path, cli):
    (tmp_path / "t.py").write_text("import torch\nx = torch.zeros(1).cuda()\n")
    r = cli("migrate", "apply", str(tmp_path))
    assert "not verified" in r.stderr
    r = cli("migrate", "scan", str(tmp_path), "--json")
    assert json.loads(r.stdout)["verified"] is False


SETUP = '''from setuptools import setup
try:
    from torch.utils.cpp_extension import CUDAExtension, CUDA_HOME
except ImportError:
    CUDAExtension = CUDA_HOME = None
try:
    import torch
    USE_CUDA = torch.cuda.is_available() and torch.version.cuda is not None
    DEV = torch.device("cuda")
except ImportError:
    USE_CUDA = False
setup(name="ext_demo", version="0.1", py_modules=[])
'''


@pytest.mark.multiprocess
def test_setup_py_builds_in_a_venv_without_opscope(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    doc = _apply(proj, {"setup.py": SETUP})
    text = (proj / "setup.py").read_text()
    assert "opscope" not in text.replace("# opscope-migrate:", "")     # only suggestions, as comments
    assert "torch.cuda.is_available()" in text and "# opscope-migrate:" in text
    assert doc["rewritten"] == 0 and doc["manual"]
    apis = {f["api"] for f in doc["manual"]}
    assert {"torch.utils.cpp_extension.CUDAExtension", "torch.utils.cpp_extension.CUDA_HOME"} <= apis
    env_dir = tmp_path / "venv"            # a plain venv: setuptools (ensurepip's), no opscope, no system packages
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    py = env_dir / "bin" / "python"
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    assert subprocess.run([py, "-c", "import opscope"], capture_output=True, env=clean, timeout=60).returncode != 0
    r = subprocess.run([py, "setup.py", "--name"], capture_output=True, text=True, cwd=proj, env=clean, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "ext_demo"


# Megatron-LM's CudaRNGStatesTracker.add and _set_cuda_rng_state (megatron/core/tensor_parallel/random.py), as
# written: seed CUDA per tensor-parallel rank, keep that state, restore CUDA's -- the CPU stream is never touched.
TRACKER = '''import sys

import torch
from torch import _C


def _set_cuda_rng_state(new_state, device=-1):
    if hasattr(_C, '_cuda_setRNGState') and callable(_C._cuda_setRNGState):
        def cb():
            _C._cuda_setRNGState(new_state)
    else:
        def cb():
            torch.cuda.default_generators[0].set_state(new_state)
    cb()


class CudaRNGStatesTracker:
    def __init__(self):
        self.states_ = {}

    def add(self, name, seed):
        orig_rng_state = torch.cuda.get_rng_state()
        torch.cuda.manual_seed(seed)
        self.states_[name] = torch.cuda.get_rng_state()
        _set_cuda_rng_state(orig_rng_state)


def main(rank):
    torch.manual_seed(1234)
    torch.cuda.manual_seed_all(1234)
    tracker = CudaRNGStatesTracker()
    tracker.add("model-parallel-rng", 1234 + 2718 + rank)
    return torch.randn(3)


if __name__ == "__main__":
    print(main(int(sys.argv[1])).tolist())
'''


@pytest.mark.multiprocess
def test_the_cpu_random_stream_is_the_same_after_the_rewrite_on_every_rank(tmp_path):
    """torch.cuda's seeding touches only CUDA's generators; the rewrite must not reseed the CPU (it did:
    compat.manual_seed was torch.manual_seed, and rank 0 and 1 then drew different CPU numbers)."""
    doc = _apply(tmp_path, {"tracker.py": TRACKER})
    assert doc["rewritten"] >= 6, doc
    text = (tmp_path / "tracker.py").read_text()
    for gone in ("torch.cuda.get_rng_state", "torch.cuda.manual_seed", "_C._cuda_setRNGState(",
                 "torch.cuda.default_generators"):
        assert gone not in text, gone
    torch.manual_seed(1234)
    want = torch.randn(3).tolist()                 # what CUDA's semantics leave the CPU stream at
    env = {k: v for k, v in os.environ.items() if k != compat.ENV}
    for rank in (0, 1):
        r = subprocess.run([sys.executable, str(tmp_path / "tracker.py"), str(rank)], capture_output=True, text=True,
                           timeout=120, env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == want, (rank, r.stdout)


def test_compat_random_calls_touch_no_cpu_state_on_the_cpu(monkeypatch):
    monkeypatch.setenv(compat.ENV, "cpu")
    torch.manual_seed(7)
    state = torch.get_rng_state()
    compat.manual_seed(99)
    compat.set_rng_state(compat.get_rng_state())
    compat.default_generators[0].manual_seed(5)
    compat.set_rng_state_all(compat.get_rng_state_all())
    assert torch.equal(torch.get_rng_state(), state)
