"""The live event stream accepts only its own runner, unpickles nothing, counts what it refuses,
notices lost messages, and its runner does not outlive the process that started it (issue 11)."""
import builtins
import os
import pickle
import signal
import stat
import subprocess
import sys
import textwrap
import time

import msgpack
import numpy as np
import psutil
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opscope.profiler import RunStore, start_profile
from opscope.profiler.batch import Batch, BatchWriter
from opscope.profiler.stream import Collector, StreamSink, step_ranges
from opscope.profiler.wire import MAX_STR, BadMessage, Opener, Sealer, _mac, new_key

SITE = (0, "add", "add_0", "m", "f.py:1", "numpy", "cpu", 0, "[[4]]", '["float32"]', "[[4]]", '["float32"]', 32, 4,
        False, 16, 0)
TENSOR = (0, 0, "out0", "[4]", "float32", 4, -1.0, 2.0, 0.5, 0.1, 0, 0, "[1,2]", -1.0, 2.0)
MEMORY = (0, -1, 123, "numpy", 4096, 0, 0)


class Touch:
    """Unpickling this creates `path`: what an attacker would send to a collector that unpickles."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return builtins.open, (self.path, "w")


def _events(n, site=0):
    ev = np.zeros((n, 5), np.int64)
    ev[:, 0] = site
    ev[:, 1] = np.arange(n)
    ev[:, 2] = np.arange(n) * 10
    ev[:, 3] = ev[:, 2] + 5
    return ev


def _sealed(key, head: dict, payload=b""):
    """A header sealed with the right key, whatever it holds: only the schema can refuse it."""
    header = msgpack.packb(head, use_bin_type=True)
    return [header, payload, _mac(key, header, payload)]


def _reason(opener, frames) -> str:
    with pytest.raises(BadMessage) as e:
        opener.open(frames)
    return e.value.reason


# --- the wire format ----------------------------------------------------------------------------
def test_a_batch_travels_whole_without_pickle():
    key = new_key()
    frames = Sealer(key).batch(Batch(3, 7, [SITE], _events(10), [TENSOR], [MEMORY], dropped=5))
    assert b"pickle" not in bytes(frames[0]) and not bytes(frames[0]).startswith(b"\x80")   # no pickle opcode
    kind, b = Opener(key).open([bytes(f) for f in frames])
    assert kind == "batch" and (b.step, b.thread, b.dropped, b.n) == (3, 7, 5, 10)
    assert b.sites == [SITE] and b.tensors == [TENSOR] and b.memory == [MEMORY]
    assert np.array_equal(b.events, _events(10))


def test_a_batch_without_events_travels_too():
    """What a recorder sends at the end of a step when the events went out already: memory samples only."""
    key = new_key()
    kind, b = Opener(key).open([bytes(f) for f in Sealer(key).batch(Batch(2, 1, [], None, [], [MEMORY]))])
    assert kind == "batch" and b.n == 0 and b.memory == [MEMORY]


def test_control_messages_round_trip_and_replays_are_refused():
    key = new_key()
    sealer, opener = Sealer(key), Opener(key)
    end = [bytes(f) for f in sealer.control("end", status="ok", error=None, error_kind=None, events=10,
                                            sent_by_step=[10], dropped=0)]
    assert opener.open(end) == ("end", {"kind": "end", "status": "ok", "error": None, "error_kind": None,
                                        "events": 10, "sent_by_step": (10,), "dropped": 0})
    assert _reason(opener, end) == "out of order"


def test_only_the_key_holder_is_heard(tmp_path):
    key = new_key()
    opener = Opener(key)
    good = [bytes(f) for f in Sealer(key).batch(Batch(0, 1, [SITE], _events(4)))]
    assert _reason(opener, [bytes(f) for f in Sealer(new_key()).batch(Batch(0, 1, [SITE], _events(4)))]) == "bad MAC"
    assert _reason(opener, [good[0], good[1] + b"\0" * 40, good[2]]) == "bad MAC"        # events appended
    assert _reason(opener, [good[0] + good[1][:8], good[1][8:], good[2]]) == "bad MAC"  # bytes moved across frames
    evil = pickle.dumps(Touch(tmp_path / "pwned"))
    assert _reason(opener, [evil]) == "wrong number of frames"
    assert _reason(opener, [evil, b""]) == "wrong number of frames"                     # the old format
    assert _reason(opener, [evil, b"", b"\0" * 32]) == "bad MAC"
    assert _reason(opener, [b"junk"]) == "wrong number of frames"
    assert not (tmp_path / "pwned").exists()
    assert opener.open(good)[0] == "batch"                 # refusals leave the real runner's stream alone


def _head(**over):
    head = {"kind": "batch", "i": 1, "dropped": 0, "step": 0, "thread": 1, "n": 2, "sites": [list(SITE)],
            "tensors": [list(TENSOR)], "memory": [list(MEMORY)]}
    head.update(over)
    return {k: v for k, v in head.items() if v is not ...}


def _with(row, i, value):
    row = list(row)
    row[i] = value
    return [row]


BAD_HEADERS = {
    "site op not a string": _head(sites=_with(SITE, 1, 5)),
    "site id a float": _head(sites=_with(SITE, 0, 1.5)),
    "site flops past int64": _head(sites=_with(SITE, 13, 1 << 63)),
    "site fallback an int": _head(sites=_with(SITE, 14, 1)),
    "site row short": _head(sites=[list(SITE[:-1])]),
    "site row a map": _head(sites=[{"op": "add"}]),
    "sites not a list": _head(sites="x"),
    "tensor min a string": _head(tensors=_with(TENSOR, 6, "nan")),
    "tensor row long": _head(tensors=[list(TENSOR) + [0]]),
    "memory backend an int": _head(memory=_with(MEMORY, 3, 0)),
    "huge string": _head(sites=_with(SITE, 2, "x" * (MAX_STR + 1))),
    "negative step": _head(step=-1),
    "n a string": _head(n="2"),
    "n does not match the payload": _head(n=3),
    "unknown kind": _head(kind="exec"),
    "extra field": _head(code="import os"),
    "missing field": _head(thread=...),
    "bool for an int": _head(thread=True),
}


@pytest.mark.parametrize("name", list(BAD_HEADERS))
def test_every_field_is_checked(name):
    key = new_key()
    with pytest.raises(BadMessage):
        Opener(key).open(_sealed(key, BAD_HEADERS[name], _events(2).tobytes()))


def test_control_fields_are_checked():
    key = new_key()
    base = {"kind": "end", "i": 1, "dropped": 0, "status": "ok", "error": None, "error_kind": None, "events": 1,
            "sent_by_step": [1]}
    assert Opener(key).open(_sealed(key, base))[0] == "end"
    deep: list = []
    for _ in range(100):
        deep = [deep]
    for bad in ({"status": "pwned"}, {"events": -1}, {"sent_by_step": [1, "x"]}, {"sent_by_step": ["x", 1]}, {"sent_by_step": [True]}, {"error": 5}, {"error_kind": "rce"}):
        with pytest.raises(BadMessage):
            Opener(key).open(_sealed(key, {**base, **bad}))
    meta = {"kind": "meta", "i": 1, "dropped": 0, "backend": "numpy", "device": "cpu", "nodes": None,
            "placement": None, "description": {"name": "x"}}
    assert Opener(key).open(_sealed(key, meta))[0] == "meta"
    for bad in ({"description": {"a": deep}}, {"description": [1]}, {"placement": {1: 2}}):
        with pytest.raises(BadMessage):
            Opener(key).open(_sealed(key, {**meta, **bad}))
    ext = msgpack.packb({**meta, "description": {"x": msgpack.ExtType(1, b"\0")}})
    with pytest.raises(BadMessage):
        Opener(key).open([ext, b"", _mac(key, ext, b"")])
    with pytest.raises(BadMessage):                         # control messages carry no payload
        Opener(key).open(_sealed(key, base, b"\0" * 40))


_plain = st.recursive(st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.floats() | st.text(),
                      lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                      max_leaves=20)
_keys = st.sampled_from(["kind", "i", "dropped", "step", "thread", "n", "sites", "tensors", "memory", "status",
                         "events", "sent_by_step", "description", "error"])
_kinds = st.sampled_from(["batch", "hello", "meta", "end", "x"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=st.lists(st.binary(max_size=64), max_size=4), head=st.dictionaries(_keys, _plain, max_size=10),
       kind=_kinds, payload=st.binary(max_size=80))
def test_nothing_but_bad_message_comes_out_of_the_decoder(frames, head, kind, payload):
    """Whatever arrives, sealed or not: a valid message or BadMessage, never another exception."""
    key = new_key()
    for msg in (frames, _sealed(key, {**head, "kind": kind}, payload)):
        try:
            Opener(key).open(msg)
        except BadMessage:
            pass


def test_step_ranges():
    assert step_ranges([3, 7]) == "3, 7"
    assert step_ranges(list(range(5, 28)) + [30]) == "5-27, 30"
    assert step_ranges(list(range(0, 100, 2)), most=3) == "0, 2, 4 and 47 more ranges"


# --- a live run under attack --------------------------------------------------------------------
def _per_step(model, backend):
    from opscope.runtime import open_session
    return len(open_session(model, backend).plan.steps)


def _intrude(endpoint: str, target) -> None:
    """What a same-user process sends once it knows the socket: a pickle that would create `target`
    (twice: bare, and shaped like a real message), junk, and a well-formed end without a valid MAC."""
    forged = msgpack.packb({"kind": "end", "i": 10**9, "dropped": 0, "status": "failed", "error": "forged",
                            "error_kind": "model", "events": 0, "sent_by_step": []})
    intruder = zmq.Context.instance().socket(zmq.PUSH)
    intruder.setsockopt(zmq.LINGER, 10_000)
    intruder.connect(endpoint)
    evil = pickle.dumps(Touch(target))
    intruder.send(evil)
    intruder.send_multipart([evil, b"", b"\0" * 32])
    intruder.send(b"junk")
    intruder.send_multipart([forged, b"", b"\0" * 32])
    intruder.close()                                      # lingers until delivered, or 10 s


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_live_run_refuses_another_process_at_connect_and_carries_on(tmp_path):
    """Only the runner's process gets a connection: another process's pickle, junk and forged end never
    reach the collector (its connection is closed at accept, and counted); the run goes on, whole."""
    pickle.loads(pickle.dumps(Touch(tmp_path / "proof")))    # the payload is real: unpickled, it creates its file
    assert (tmp_path / "proof").exists()
    target = tmp_path / "pwned"
    store = RunStore()
    steps = 50
    live = start_profile("demo:mlp", "numpy", steps=steps, store=store, hardware=False)
    endpoint = live.collector.endpoint
    assert endpoint.startswith("ipc://")
    folder = os.path.dirname(endpoint[len("ipc://"):])
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    _intrude(endpoint, target)

    assert live.wait(240) == "ok", live.error
    assert not target.exists()
    r = store.get_run(live.run_id)
    assert r["status"] == "ok" and r["error"] is None
    assert r["events"] + r["dropped"] == steps * _per_step("demo:mlp", "numpy")
    assert r["events"] == len(store.events_frame(live.run_id)["seq"])
    report = r["config"]["stream"]
    assert report["only_runner"] is True
    assert report["refused_connections"] >= 1 and live.collector.connections == 1   # the runner's, once
    assert report["rejected"] == live.rejected == 0          # nothing of the intruder's was even read
    assert not os.path.exists(folder)                     # the socket's folder goes with the run


@pytest.mark.multiprocess
def test_where_the_pid_cannot_tell_them_apart_the_key_refuses_a_pickle_junk_and_a_forged_end(tmp_path):
    """A socket in the runner's own process passes the pid check (and on macOS there is none): the MAC
    and the schema still refuse everything but the runner's messages, count them, and the run goes on."""
    target = tmp_path / "pwned"
    store = RunStore()
    run = store.create_run(model="m", backend="numpy")
    col = Collector(store, run).start()                     # listens to this process: sink and intruder both
    sink = StreamSink(col.endpoint, col.key)
    assert sink.send(Batch(0, 1, [SITE], _events(4)))
    _intrude(col.endpoint, target)
    assert sink.send(Batch(1, 1, [], _events(4)))
    assert sink.end("ok")
    assert col.ended.wait(60)
    col.stop()
    sink.close()
    assert not target.exists()
    assert col.events == 8 and col.verdict()[0] is None
    assert col.rejected == 4 and col.rejected_why == {"wrong number of frames": 2, "bad MAC": 2}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_stream_key_is_in_neither_the_runners_environment_nor_its_command_line():
    """/proc/PID/environ shows the environment a process was started with for as long as it runs,
    whatever os.environ.pop did, to every process of the same user (one read the key there and forged a
    run's end); the command line shows in `ps` to everyone. The key comes down a pipe instead."""
    store = RunStore()
    live = start_profile("demo:mlp", "numpy", steps=100_000_000, store=store, hardware=False)
    try:
        deadline = time.monotonic() + 240
        while live.events_received == 0 and live.poll() == "running" and time.monotonic() < deadline:
            time.sleep(0.1)                               # the runner has its key: its events arrive
        assert live.events_received > 0, live.error
        key = live.collector.key
        with open(f"/proc/{live.pid}/environ", "rb") as f:
            environ = f.read()
        with open(f"/proc/{live.pid}/cmdline", "rb") as f:
            cmdline = f.read()
        assert b"opscope.profiler.runner" in cmdline and b"OPSCOPE_PARENT_PIPE=" in environ   # the right process
        for text in (environ, cmdline):
            assert key.hex().encode() not in text.lower() and key not in text
        assert b"OPSCOPE_STREAM" not in environ
    finally:
        live.kill()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_lost_messages_mark_the_run_incomplete_and_name_the_steps(monkeypatch):
    """The runner's own count is compared with what arrived: a message lost on the way is not silent."""
    real_write = BatchWriter.write
    lost = {3, 7}

    def lossy(self, batches):             # the transport losing every batch of two steps, uncounted
        return real_write(self, [b for b in batches if b.step not in lost])
    monkeypatch.setattr(BatchWriter, "write", lossy)
    store = RunStore()
    steps, per = 10, _per_step("demo:mlp", "numpy")
    live = start_profile("demo:mlp", "numpy", steps=steps, store=store, hardware=False)
    assert live.wait(240) == "incomplete", live.error
    r = store.get_run(live.run_id)
    assert r["status"] == "incomplete"
    assert r["error"].startswith("incomplete:") and "steps 3, 7" in r["error"], r["error"]
    stream = r["config"]["stream"]
    assert stream["missing_steps"] == "3, 7" and stream["missing_events"] == 2 * per
    assert r["events"] == (steps - 2) * per


# --- the runner dies with its parent ------------------------------------------------------------
def _runner_of(parent: psutil.Process, timeout=240) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in parent.children(recursive=True):
            try:
                if "opscope.profiler.runner" in " ".join(c.cmdline()):
                    return c
            except psutil.NoSuchProcess:
                pass
        assert parent.is_running(), "the profiling process ended before its runner started"
        time.sleep(0.2)
    raise AssertionError("no runner process appeared")


def _gone(p: psutil.Process, timeout=15) -> bool:
    """Exited (a zombie counts: init reaps it when it gets to it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.multiprocess
@pytest.mark.slow
def test_kill_9_of_opscope_profile_takes_its_runner_along():
    proc = subprocess.Popen([sys.executable, "-m", "opscope.app", "profile", "demo:mlp", "--backend", "numpy",
                             "--steps", "100000000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        runner = _runner_of(psutil.Process(proc.pid))
        time.sleep(1.0)                    # past the runner's start-up: its death handling is armed
        assert runner.is_running()
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert _gone(runner), f"runner {runner.pid} outlived its parent"
    finally:
        proc.kill()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_runner_started_from_a_worker_thread_lives_with_the_process_not_the_thread(tmp_path):
    """PR_SET_PDEATHSIG fires when the spawning *thread* ends: a run started from a worker thread (a web
    request) must go on after that thread ends, and still die with the process."""
    script = tmp_path / "start_in_thread.py"
    script.write_text(textwrap.dedent("""
        import threading, time
        from opscope.profiler import start_profile
        box = {}

        def request():                     # like a web request: starts a run, then the thread ends
            live = box["live"] = start_profile("demo:mlp", "numpy", steps=100_000_000, hardware=False)
            while live.events_received == 0:      # the runner is up (its death handling armed) ...
                time.sleep(0.05)
        t = threading.Thread(target=request)
        t.start(); t.join()                # ... before this thread ends
        print(box["live"].pid, flush=True)
        time.sleep(600)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        runner = psutil.Process(int(proc.stdout.readline()))
        time.sleep(3.0)                    # the spawning thread is long gone
        assert runner.is_running() and runner.status() != psutil.STATUS_ZOMBIE
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert _gone(runner), f"runner {runner.pid} outlived its parent"
    finally:
        proc.kill()
