"""A live run's spans are served from the collector's memory as they arrive (profiler/tail.py), before the store
has them, and a page's ask may wait for the next ones (a long poll) instead of polling on a timer."""
import threading
import time

import numpy as np
import pytest

from opscope.profiler import RunStore
from opscope.profiler.batch import Batch
from opscope.profiler.tail import LiveTail

_SITE = (0, "matmul", "fc1/mm", "fc1", "", "numpy", "cpu", 0, "[]", "[]", "[]", "[]", 8, 16, False, 0, 0, "forward",
         "", "", "")


def _batch(step: int, first_seq: int, n: int, sites=()) -> Batch:
    ev = np.array([[0, first_seq + i, 1000 * (first_seq + i), 1000 * (first_seq + i) + 500, 0] for i in range(n)],
                  np.int64)
    return Batch(step, 7, list(sites), ev)


def test_the_tail_answers_spans_since_n_in_arrival_order_and_lets_the_oldest_go():
    tail = LiveTail(limit=6)
    tail.add(_batch(0, 0, 4, [_SITE]))
    tail.add(_batch(1, 4, 4))
    got = tail.since(2)
    assert got["seq"].tolist() == [2, 3, 4, 5, 6, 7] and got["step"].tolist() == [0, 0, 1, 1, 1, 1]
    assert got["thread"].tolist() == [7] * 6 and got["total"] == 8 and got["lanes"] == {(0, 7)}
    assert got["sites"][0][1] == "matmul"
    tail.add(_batch(2, 8, 4))        # past the limit: the oldest batch goes, the count goes on
    assert tail.first == 4 and tail.total == 12
    assert tail.since(0) is None      # not held: the caller reads the store
    assert tail.since(4)["seq"].tolist() == list(range(4, 12))
    assert len(tail.since(12)["seq"]) == 0 and len(tail.since(99)["seq"]) == 0


def test_a_wait_on_the_tail_ends_when_a_new_span_arrives_or_the_run_ends():
    tail = LiveTail()
    tail.add(_batch(0, 0, 2, [_SITE]))
    assert tail.wait(1, 0) is True                   # one past the first is here already
    out = []
    waiter = threading.Thread(target=lambda: out.append(tail.wait(2, 120)))
    waiter.start()
    tail.add(_batch(1, 2, 1))
    waiter.join(120)
    assert out == [True]
    waiter = threading.Thread(target=lambda: out.append(tail.wait(3, 120)))
    waiter.start()
    tail.end()                                       # nothing more will come: the wait says so at once
    waiter.join(120)
    assert out == [True, False]
    # and what it held is let go: the store has it all by now, a reader reads it there
    assert tail.since(0) is None and tail.since(2) is None and not tail._chunks and tail.total == 3


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_live_runs_spans_reach_the_endpoint_before_they_are_in_the_store():
    from opscope.app.web.data import WebData
    from opscope.app.web.server import create_app
    from opscope.profiler.live import start_profile

    store = RunStore()
    live = start_profile("demo:mlp", "numpy", steps=100_000, store=store, hardware=False)   # killed below
    rid = live.run_id

    def stored() -> int:
        return int(store.query("SELECT count(*) FROM events WHERE run_id = ?", [rid])[0][0])

    try:
        client = create_app(store=store, live=live).server.test_client()

        def answer(since, **query):
            more = "".join(f"&{k}={v}" for k, v in query.items())
            r = client.get(f"/_opscope/live_spans?run={rid}&since={since}{more}")
            assert r.status_code == 200, r.get_json()
            return r.get_json()

        for bad in ("-1", "x", "nan", "6"):
            r = client.get(f"/_opscope/live_spans?run={rid}&since=0&wait={bad}")
            assert r.status_code == 400 and "wait is in seconds" in r.get_json()["error"]
        deadline = time.monotonic() + 240
        while live.events_received == 0:
            assert time.monotonic() < deadline and live.poll() == "running", live.poll()
            time.sleep(0.05)
        with live.collector.writer._lock:             # the store takes none of this run's events until released
            held = stored()
            ahead = answer(held, wait=5)                 # a long poll: answered once a span past `held` arrived
            while not ahead["start"]:
                assert time.monotonic() < deadline and live.poll() == "running", live.poll()
                ahead = answer(held, wait=5)
            assert ahead["since"] == held and ahead["total"] >= held + len(ahead["start"]) > held
            # a window of the run (what a page draws first) holds them too
            window = client.get(f"/_opscope/timeline?run={rid}").get_json()
            assert window["events"] >= ahead["total"], (window.get("events"), ahead["total"])
            assert stored() == held                       # the endpoint had them; the store did not
        live.kill()
        # the store, caught up, holds the same spans after its first `held`, named and on the tracks it names them
        # (a write's rows go in in the join's order: the same spans per write, not always the same order in it)
        keys = ("start", "end", "step", "seq", "name", "track")
        spans = lambda doc: set(zip(*(doc[k] for k in keys)))     # noqa: E731
        whole = WebData(store).live_spans(store.get_run(rid), 0)
        before, after = (spans({k: whole[k][a:b] for k in keys}) for a, b in ((0, held), (held, None)))
        assert spans(ahead) <= after and not spans(ahead) & before and len(spans(ahead)) == len(ahead["start"])
    finally:
        live.kill()


@pytest.mark.multiprocess
def test_a_collector_stopped_with_writes_queued_behind_a_busy_store_stores_every_span_that_arrived():
    """A run ended by Ctrl-C (no end message; LiveRun stops the collector): what arrived and waits for the store
    writer thread is written before stop() returns, and the tail, ahead of the store until then, is let go."""
    from opscope.profiler.stream import Collector, StreamSink
    store = RunStore()
    rid = store.create_run(model="m", backend="numpy")
    col = Collector(store, rid).start()
    sink = StreamSink(col.endpoint, col.key)
    sent = 0
    with col.writer._lock:                          # the store takes nothing until released
        for b in range(20):
            batch = _batch(b, 100 * b, 100, [_SITE] if b == 0 else [])
            assert sink.send(batch)
            sent += batch.n
        deadline = time.monotonic() + 120
        while col.tail.total < sent:                # all arrived (in the collector's memory), none stored
            assert time.monotonic() < deadline, col.tail.total
            time.sleep(0.02)
        assert col.events == 0
        stopper = threading.Thread(target=col.stop, kwargs={"drain_s": 0.5})
        stopper.start()
        time.sleep(0.5)                             # stop() is under way, the writes still held
    stopper.join(120)
    sink.close()
    assert not stopper.is_alive() and col.error is None
    assert col.events == sent == store.query("SELECT count(*) FROM events WHERE run_id = ?", [rid])[0][0]
    assert col.tail.ended and col.tail.since(0) is None


def test_the_store_writes_hold_at_most_max_pending_batches_while_the_store_is_busy():
    """The collector hands batches to its store writer thread without waiting; what waits there is bounded in
    batches (not in hand-overs, which may each hold MAX_PENDING), and all of it is stored once the store frees."""
    from opscope.profiler.batch import BatchWriter
    from opscope.profiler.stream import MAX_PENDING, _StoreWrites
    store = RunStore()
    rid = store.create_run(model="m", backend="numpy")
    writer = BatchWriter(store, rid)
    writes = _StoreWrites(writer, "test-store-writes")
    writes.start()
    handed = 0
    with writer._lock:                                   # the store is busy: nothing is written until released
        for i in range(MAX_PENDING):
            batches = [_batch(0, handed + k, 1, [_SITE] if handed + k == 0 else []) for k in range(10)]
            if not writes.put(batches, block=False):
                break
            handed += len(batches)
        assert 0 < handed <= MAX_PENDING < handed + 10 and writes._held == handed
    writes.drain()
    writes.close()
    assert writes._held == 0 and writer.events == handed
    assert store.query("SELECT count(*) FROM events WHERE run_id = ?", [rid])[0][0] == handed


def test_spans_from_the_tail_are_named_and_tracked_as_a_read_of_the_store_names_them():
    """The tail's spans go through the store's own naming and track SQL (app/web/data.py _name_pairs): over sites
    of every kind a track key tells apart -- a kernel named by its node, an op with no name, nested depths,
    collectives, a compiler stack's per-op lane, two threads -- the live answer from memory equals the one a read
    of the store gives."""
    from opscope.app.web.data import WebData, _tail_spans
    from opscope.profiler.batch import BatchWriter
    from opscope.profiler.importers.kineto import DEVICE_OPS
    kernel = sorted(DEVICE_OPS)[0]
    rest = ("[]", "[]", "[]", "[]", 8, 16, False, 0, 0)
    sites = [(0, "matmul", "fc1/mm", "fc1", "", "numpy", "cpu", 0, *rest, "forward", "", "", ""),
             (1, kernel, "sgemm_128x64", "", "", "cuda", "cuda:0", 3, *rest, "forward", "", "", ""),
             (2, kernel, None, "", "", "cuda", "cuda:0", 0, *rest, "forward", "", "", ""),
             (3, None, None, "", "", "numpy", "cpu", None, *rest, "backward", "", "", ""),
             (4, "all_reduce", "ar", "", "", "numpy", "cpu", 0, *rest, "communication", "", "", ""),
             (5, "gelu", "fc1/gelu", "fc1", "", "onnxruntime", "CPUExecutionProvider", 1, *rest, "forward", "",
              "region_0", "onnxruntime (per node)"),
             (6, "add", "add", "", "", "numpy", "cpu", 2, *rest, "optimizer", "", "", "")]
    store = RunStore()
    rid = store.create_run(model="m", backend="numpy")
    writer, tail = BatchWriter(store, rid), LiveTail()
    seq = 0
    for step in range(2):
        for thread in (1, 2):
            ev = np.array([[s[0], seq + i, 1000 * (seq + i), 1000 * (seq + i) + 500, 0]
                           for i, s in enumerate(sites)], np.int64)
            seq += len(sites)
            batch = Batch(step, thread, sites if seq == len(sites) else [], ev)
            tail.add(batch)
            writer.write([batch])
    data = WebData(store)
    keys = ("start", "end", "step", "seq", "name", "track")
    as_set = lambda doc: set(zip(*(doc[k] for k in keys)))     # noqa: E731
    stored = data.live_spans(store.get_run(rid), 0)
    ours = _tail_spans(tail.since(0), 0, None, data._named(rid))
    assert ours["total"] == stored["total"] == 2 * 2 * len(sites)
    assert as_set(ours) == as_set(stored) and len(set(ours["track"])) > 4, sorted(set(ours["track"]))
