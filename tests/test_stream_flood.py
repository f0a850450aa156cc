"""The collector survives a flood (issue 24): connections from any process but its runner are closed at
accept and counted, so idle ones cannot exhaust its descriptors (1,100 aborted it: "Too many open files",
exit 134) and an oversized multipart message is never read; what its own process sends past the wire's
parts and bounds is dropped and counted; the run keeps every event its runner sent."""
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest
import zmq

from opscope.profiler import RunStore, start_profile
from opscope.profiler.batch import Batch
from opscope.profiler.stream import Collector, StreamSink

# the pid check is libzmq's SO_PEERCRED, and the tests read /proc
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: SO_PEERCRED and /proc")

SITE = (0, "add", "add_0", "m", "f.py:1", "numpy", "cpu", 0, "[[4]]", '["float32"]', "[[4]]", '["float32"]', 32, 4,
        False, 16, 0)

# A model whose first step waits for a file: the run stays up, its runner connected, until the test has
# flooded it, and ends on its own (with the runner's own count) once the file exists.
WAITS = """
import os, time, torch

class Waits(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        while not os.path.exists({go!r}):
            time.sleep(0.02)
        return self.lin(x).relu()

def factory():
    return Waits(), (torch.randn(4, 8),)
"""

# Another process of the same user: connects `n` times to the socket, `hold` connections at a time, and
# counts the ones the collector closed (EOF before any byte: refused at accept, not left idle).
FLOOD = """
import socket, sys
path, n, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
closed = 0
for start in range(0, n, hold):
    socks = []
    for _ in range(min(hold, n - start)):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        socks.append(s)
    for s in socks:
        s.settimeout(120)
        closed += s.recv(1) == b""
        s.close()
print(closed)
"""


def _waiting_model(tmp_path):
    go = tmp_path / "go"
    model = tmp_path / "waits.py"
    model.write_text(WAITS.format(go=str(go)))
    return f"{model}:factory", go


def _events(n):
    ev = np.zeros((n, 5), np.int64)
    ev[:, 1] = np.arange(n)
    ev[:, 2] = np.arange(n) * 10
    ev[:, 3] = ev[:, 2] + 5
    return ev


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_collector_flooded_with_10000_connections_keeps_running_and_every_event(tmp_path):
    spec, go = _waiting_model(tmp_path)
    store = RunStore()
    live = start_profile(spec, "torch:cpu", engine="eager", steps=20, store=store, hardware=False)
    try:
        path = live.collector.endpoint[len("ipc://"):]
        flood = subprocess.run([sys.executable, "-c", FLOOD, path, "10000", "500"], capture_output=True, text=True,
                               timeout=240)
        assert flood.returncode == 0, flood.stderr
        assert int(flood.stdout) == 10_000                # every connection was closed by the collector
        assert live.poll() == "running"
    finally:
        go.touch()
    assert live.wait(240) == "ok", live.error             # the runner's own count: nothing lost on the way
    r = store.get_run(live.run_id)
    assert r["status"] == "ok" and r["events"] > 0
    assert r["events"] == len(store.events_frame(live.run_id)["seq"])
    steps = store.events_frame(live.run_id)["step"]
    assert sorted(set(steps)) == list(range(20))
    stream = r["config"]["stream"]
    assert stream["refused_connections"] == 10_000 and stream["rejected"] == 0
    assert live.collector.connections == 1               # the runner's own, and no other


def _peak_rss(pid: int) -> int:
    """VmHWM: the most memory the process ever held, so a message read and freed still shows."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))


def _listening_socket(pid: int, timeout: float = 240) -> str:
    """The collector's socket, found the way a same-user process would: from the kernel's socket table."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in psutil.Process(pid).net_connections(kind="unix"):
            if c.laddr and c.laddr.endswith("/stream"):
                return c.laddr
        time.sleep(0.1)
    raise AssertionError("the collector never listened")


def _at_1024_descriptors():
    """preexec_fn: the collector gets the descriptor limit most machines give a user."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_1000_idle_connections_and_an_oversized_multipart_message_are_refused_and_counted(tmp_path, opscope_home):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip(f"the attacking test needs 1,300 descriptors (hard limit {hard})")
    spec, go = _waiting_model(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "opscope.app", "profile", spec, "--backend", "torch:cpu",
                             "--engine", "eager", "--steps", "5", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_at_1024_descriptors)
    idle = []
    try:
        path = _listening_socket(proc.pid)
        before = _peak_rss(proc.pid)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300), hard))
        for _ in range(1100):                             # past the collector's 1,024: without the check, exit 134
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            idle.append(s)
        for s in idle:
            s.settimeout(120)
            assert s.recv(1) == b"", "the collector kept a connection from another process open"
        assert proc.poll() is None, proc.stderr.read()

        ctx = zmq.Context()                               # the attacker's own: term() waits out the linger
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 3000)
        push.connect(f"ipc://{path}")
        part = b"\0" * (8 << 20)
        push.send_multipart([part] * 40, copy=False)      # 320 MiB in parts under MAXMSGSIZE each
        push.close()
        ctx.term()
        assert proc.poll() is None, proc.stderr.read()
        assert _peak_rss(proc.pid) - before < 100 << 20   # never read (reading it took 320 MiB and more)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for s in idle:
            s.close()
        go.touch()
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    doc = json.loads(out)
    assert doc["status"] == "ok" and doc["events"] > 0
    stream = RunStore().get_run(doc["run_id"])["config"]["stream"]
    assert stream["refused_connections"] > 1100 and stream["rejected"] == 0     # the idle ones, and the PUSH
    assert stream["only_runner"] is True


@pytest.mark.multiprocess
def test_parts_past_the_wire_from_the_runners_own_process_are_dropped_and_counted():
    """The pid check lets in whatever the runner's process sends. ZeroMQ's MAXMSGSIZE bounds each part, not
    their number: 50 small parts pass it. The collector reads part by part, keeps at most the wire's three
    within their bounds, and drops and counts the rest; the run goes on with every event."""
    store = RunStore()
    run = store.create_run(model="m", backend="numpy")
    col = Collector(store, run).start()
    sink = StreamSink(col.endpoint, col.key)
    odd = zmq.Context.instance().socket(zmq.PUSH)
    odd.setsockopt(zmq.LINGER, 10_000)
    odd.connect(col.endpoint)
    try:
        assert sink.send(Batch(0, 1, [SITE], _events(4)))
        odd.send_multipart([b"x" * 1024] * 50)            # too many parts
        odd.send_multipart([b"\x80", b"", b"\0" * 33])     # a part past its bound (the MAC is 32 bytes)
        assert sink.send(Batch(1, 1, [], _events(4)))
        assert sink.end("ok")
        assert col.ended.wait(60)
    finally:
        odd.close()
        col.stop()
        sink.close()
    assert col.events == 8 and col.verdict()[0] is None
    assert col.rejected_why == {"wrong number of frames": 1, "bad frame size": 1}


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_another_local_user_can_neither_connect_nor_read_the_runners_environment(tmp_path):
    """A throwaway unprivileged user, made here: the socket's folder is 0700 and /proc/PID/environ is the
    owner's, so both are refused by the kernel before opscope is asked."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("needs root (to make a throwaway user), useradd and runuser")
    python = "/usr/bin/python3"              # the other user cannot read root's own interpreter's folder
    if not os.access(python, os.X_OK):
        pytest.skip(f"needs {python}")
    store = RunStore()
    live = start_profile("demo:mlp", "numpy", steps=100_000_000, store=store, hardware=False)
    user = f"opscope-s{os.getpid()}"
    subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", user], check=True, capture_output=True, timeout=60)
    try:
        probe = textwrap.dedent("""
            import os, socket, sys
            path, pid = sys.argv[1:]
            for what, attempt in (("connect", lambda: socket.socket(socket.AF_UNIX).connect(path)),
                                  ("environ", lambda: open(f"/proc/{pid}/environ", "rb").read())):
                try:
                    attempt()
                    print(what, "allowed")
                except PermissionError:
                    print(what, "refused")
            print(os.getuid())
        """)
        r = subprocess.run(["runuser", "-u", user, "--", python, "-c", probe, live.collector.endpoint[len("ipc://"):],
                            str(live.pid)], capture_output=True, text=True, timeout=120, cwd="/")
        assert r.returncode == 0, r.stderr
        *answers, uid = r.stdout.split("\n")[:-1]
        assert answers == ["connect refused", "environ refused"] and uid != "0", r.stdout
        assert live.poll() == "running"
    finally:
        live.kill()
        subprocess.run(["userdel", user], capture_output=True, timeout=60)
