"""The live stream: a slow reader makes the sender drop and count, never block and never lose silently."""
import numpy as np
import pytest

from opscope.profiler.batch import Batch
from opscope.profiler.recorder import Recorder
from opscope.profiler.store import RunStore
from opscope.profiler.stream import Collector, StreamSink
from opscope.runtime import open_session


def _site(i):
    return (i, "add", f"add_{i}", "m", "f.py:1", "numpy", "cpu", 0, "[[4]]", '["float32"]', "[[4]]", '["float32"]',
            32, 4, False, 16, 0)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_full_queue_drops_and_counts_and_the_count_arrives():
    store = RunStore()
    run = store.create_run(model="m", backend="numpy")
    col = Collector(store, run, hwm=1)               # bound, but not reading yet: the slowest reader
    sink = StreamSink(col.endpoint, col.key, hwm=1)
    per, batches, ok = 2000, 400, 0
    sent_sites = False
    for b in range(batches):
        ev = np.zeros((per, 5), np.int64)
        ev[:, 0] = b % 3
        ev[:, 1] = np.arange(per)
        ev[:, 2] = np.arange(per) * 10
        ev[:, 3] = ev[:, 2] + 5
        batch = Batch(step=b, thread=1, sites=[] if sent_sites else [_site(i) for i in range(3)], events=ev)
        if sink.send(batch):                        # NOBLOCK: returns at once either way
            ok += 1
            sent_sites = True
    assert sink.dropped > 0 and sink.dropped == (batches - ok) * per
    col.start()
    assert sink.end("ok")
    assert col.ended.wait(60)
    col.stop()
    sink.close()
    assert col.events == ok * per
    assert col.events + col.dropped == batches * per
    r = store.get_run(run)
    assert r["events"] == ok * per and r["dropped"] == sink.dropped
    assert col.verdict()[0] is None          # dropped and counted is not lost: the run is complete
    assert store.query("SELECT count(*) FROM events WHERE run_id = ? AND op IS NULL", [run])[0][0] == 0


class _DropFirst:
    """A stream whose queue is full for the first batch only (the one that carries every site)."""

    def __init__(self, inner):
        self.inner, self.first = inner, True

    def send(self, batch):
        if self.first:
            self.first = False
            self.inner.dropped += batch.n
            return False
        return self.inner.send(batch)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_recorder_resends_sites_after_a_dropped_batch():
    """The first batch (which carries the op names) may be the one dropped: later events still resolve."""
    store = RunStore()
    run = store.create_run(model="demo:mlp", backend="numpy")
    col = Collector(store, run, hwm=1)
    sink = _DropFirst(StreamSink(col.endpoint, col.key, hwm=1))
    s = open_session("demo:mlp", "numpy")
    rec = Recorder(sink)
    steps = 50
    with s.executor.hooked(rec):
        for _ in range(steps):
            s.run()
    col.start()
    sink.end("ok")
    assert col.ended.wait(60)
    col.stop()
    per_step = len(s.plan.steps)
    assert sink.dropped >= per_step and col.events + sink.dropped == steps * per_step
    stats = store.op_stats(run)
    assert sum(x["count"] for x in stats) == col.events
    assert {x["op"] for x in stats} <= {n.op for n in s.graph.nodes}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_runner_that_exits_right_after_its_end_still_delivers_it(tmp_path):
    """The end must not die with the runner process. The collector binds only after the runner has
    queued every message and reached exit: a runner that exits without flushing its ZeroMQ context
    (pyzmq does not at interpreter exit) loses them all; one that flushes waits and delivers."""
    import os
    import subprocess
    import sys
    import time

    import zmq

    from opscope.profiler.runner import PIPE_ENV, handover
    from opscope.profiler.wire import BadMessage, Opener, new_key

    key = new_key()
    endpoint = f"ipc://{tmp_path}/stream"
    pipe_r, pipe_w = os.pipe()             # what live.py hands a runner: the endpoint and key, down a pipe
    proc = subprocess.Popen([sys.executable, "-m", "opscope.profiler.runner",
                             "--model", "demo:mlp", "--backend", "numpy", "--steps", "1"],
                            env=dict(os.environ, **{PIPE_ENV: str(pipe_r)}), pass_fds=(pipe_r,),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    os.close(pipe_r)
    os.write(pipe_w, handover(endpoint, key))
    os.close(pipe_w)                       # EOF at once: the runner does not wait for its end to be read
    try:
        time.sleep(1.0)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            # the runner has done its work once its CPU time stops growing; it must still be waiting
            if proc.poll() is None and _idle(proc.pid):
                break
        assert proc.poll() is None, "the runner exited with its messages undelivered:\n" + proc.stdout.read().decode()
        sock = zmq.Context.instance().socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(endpoint)
        opener, kinds = Opener(key), []
        while "end" not in kinds:
            assert sock.poll(60_000), f"no end arrived; got {kinds}"
            try:
                kinds.append(opener.open(sock.recv_multipart())[0])
            except BadMessage as e:
                raise AssertionError(f"a message from our runner was refused: {e}") from None
        sock.close()
        assert kinds[0] == "hello" and "batch" in kinds and kinds[-1] == "end"
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        proc.wait()


def _idle(pid: int) -> bool:
    import time

    import psutil
    p = psutil.Process(pid)
    before = sum(p.cpu_times()[:2])
    time.sleep(0.5)
    return sum(p.cpu_times()[:2]) - before < 0.02


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_runner_waits_for_a_collector_that_fell_behind_before_it_exits():
    """On a loaded machine the collector can be seconds behind when the runner sends its end. ZeroMQ
    drops what still sits in the socket when the sender exits while the reader's queue is full (seen in
    CI: "exited with code 0 without reporting the end of the run"), so the runner must not exit before
    the collector has its end. The collector is held here, as a busy machine holds it, until the runner
    has exited or has waited long enough to show it waits."""
    import time

    from opscope.profiler.live import start_profile

    store = RunStore()
    live = start_profile("demo:mlp", "numpy", steps=200, store=store, hardware=False, hwm=2)
    write = live.collector.writer.write
    held = []

    def behind(batches):
        if not held:
            t0 = time.monotonic()
            while live.proc.poll() is None and time.monotonic() - t0 < 10:
                time.sleep(0.05)
            held.append(live.proc.poll())
        return write(batches)

    live.collector.writer.write = behind
    assert live.wait(240) in ("ok", "incomplete"), live.error
    assert held == [None], "the runner exited while the collector was behind"
    assert live.collector.end is not None


HUGE_ERROR = """
import torch

class Refuses(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        raise ValueError("too long " + "x" * 2_000_000)

def factory():
    return Refuses(), (torch.randn(4, 8),)
"""


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_model_error_longer_than_the_wire_takes_still_ends_the_run_at_once(tmp_path):
    """The end carries the model's error; one past the wire's 1 MiB bound would have the end refused (and
    the runner, which waits for its end to be read, waiting for nothing)."""
    from opscope.profiler.live import start_profile

    f = tmp_path / "refuses.py"
    f.write_text(HUGE_ERROR)
    store = RunStore()
    live = start_profile(f"{f}:factory", "torch:cpu", engine="eager", steps=1, store=store, hardware=False)
    assert live.wait(240) == "failed"
    assert live.collector.rejected == 0 and live.collector.end is not None, live.collector.rejected_why
    error = store.get_run(live.run_id)["error"]
    assert error.startswith("ValueError: too long xxx") and error.endswith("[...]") and len(error) < 20_000


@pytest.mark.parametrize("value", ["", "abc", "-1", "99999999999999999999999", "987654"])
def test_a_runner_given_no_usable_pipe_goes_without_one(monkeypatch, value):
    """The pipe's descriptor arrives in the environment: anything but an open descriptor means no pipe,
    never a traceback."""
    import os

    from opscope.profiler import runner
    monkeypatch.setenv(runner.PIPE_ENV, value)
    assert runner._take_pipe() is None
    assert runner.PIPE_ENV not in os.environ      # taken: the model's own processes never see it


@pytest.mark.parametrize("line", [b"", b"ipc:///tmp/x/stream", b"ipc:///tmp/x/stream abc\n", b" " + b"ab" * 32 + b"\n",
                                  b"ipc:///tmp/x/stream " + b"ab" * 31 + b"\n", b"\xff\xfe " + b"zz" * 32,
                                  b"x" * 5000])
def test_a_runner_given_a_bad_line_down_its_pipe_has_no_stream(line):
    """What the parent writes is checked: a short or missing key, no endpoint, junk, a line past the
    bound -- no stream (the runner then exits 2 with one line), never a traceback."""
    import os

    from opscope.profiler import runner
    r, w = os.pipe()
    os.write(w, line)
    os.close(w)
    try:
        assert runner._take_stream(r) is None
    finally:
        os.close(r)


def test_the_line_down_the_pipe_round_trips():
    import os

    from opscope.profiler import runner
    from opscope.profiler.wire import new_key
    key, endpoint = new_key(), "ipc:///tmp/a folder with spaces/stream"
    r, w = os.pipe()
    os.write(w, runner.handover(endpoint, key))       # the write end stays open, as the parent keeps it
    try:
        assert runner._take_stream(r) == (endpoint, key)
    finally:
        os.close(r)
        os.close(w)
