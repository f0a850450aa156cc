import os
import signal
import subprocess
import sys

import pytest


@pytest.fixture(autouse=True)
def opscope_home(tmp_path, monkeypatch):
    """Every test gets its own run store and backend folder (DESIGN.md: OPSCOPE_HOME)."""
    home = tmp_path / "opscope-home"
    home.mkdir()
    monkeypatch.setenv("OPSCOPE_HOME", str(home))
    return home


def run_cli(*args, timeout=300, env=None, input=None):
    """Run the installed `opscope` command in a subprocess: what a user types."""
    e = dict(os.environ)
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-m", "opscope.app", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=e, input=input)


@pytest.fixture
def cli():
    return run_cli


def ctrl_c_able():
    """preexec_fn for a child the test will Ctrl-C (SIGINT): as a terminal's foreground job gets it.

    A shell runs a background job (`.ci/run &`, nohup) with SIGINT ignored, every descendant inherits
    that, and Python then installs no KeyboardInterrupt handler: the Ctrl-C tests would test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def layer_trace(tmp_path):
    """Records a real torch.profiler trace: a small transformer layer run `runs` times, with shapes, Python
    stacks and memory (record_shapes, with_stack, profile_memory). -> record(runs) -> the trace's path."""
    def record(runs: int = 3):
        import torch
        torch.manual_seed(0)
        layer, x = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval(), torch.randn(2, 8, 32)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                    with_stack=True, profile_memory=True) as prof:
            for _ in range(runs):
                with torch.no_grad():
                    layer(x)
        path = tmp_path / f"layer{runs}.json"
        prof.export_chrome_trace(str(path))
        return path
    return record
