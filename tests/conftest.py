import fcntl
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import threading

import pytest


@pytest.fixture(autouse=True)
def opscope_home(tmp_path, monkeypatch):
    """Every test gets its own run store and backend folder (DESIGN.md: OPSCOPE_HOME)."""
    home = tmp_path / "opscope-home"
    home.mkdir()
    monkeypatch.setenv("OPSCOPE_HOME", str(home))
    return home


def run_cli(*args, timeout=300, env=None, input=None, tty=False):
    """Run the installed `opscope` command in a subprocess: what a user types. tty: in a terminal (`opscope debug`
    needs one), stdout is then what it drew there."""
    e = dict(os.environ)
    if env:
        e.update(env)
    if tty:
        p = popen_in_a_terminal(args, env=e)
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            raise
        return subprocess.CompletedProcess(p.args, p.returncode, p.drawn(), err)
    return subprocess.run([sys.executable, "-m", "opscope.app", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=e, input=input)


def popen_in_a_terminal(args, **kwargs):
    """Start `opscope ARGS` with a pseudo-terminal (80x24) as stdin and stdout, stderr a pipe (text). A thread
    drains the terminal so the child never blocks writing to it; p.drawn() -> what it wrote there so far."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    try:
        p = subprocess.Popen([sys.executable, "-m", "opscope.app", *map(str, args)], stdin=slave, stdout=slave,
                             stderr=subprocess.PIPE, text=True, **kwargs)
    finally:
        os.close(slave)
    chunks = []

    def drain():
        try:
            while chunk := os.read(master, 65536):
                chunks.append(chunk)
        except OSError:                 # EIO: every holder of the terminal's other side has closed it
            pass
        finally:
            os.close(master)
    threading.Thread(target=drain, daemon=True).start()
    p.drawn = lambda: b"".join(chunks).decode(errors="replace")
    return p


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
