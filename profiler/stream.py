"""The live event stream: runner -> collector over ZeroMQ PUSH/PULL on 127.0.0.1.

The sender never blocks the model: it sends with NOBLOCK under a small high-water mark. When the
queue is full the batch is dropped and its events counted; every later message carries the
cumulative count, so the store always knows how many events it does not have. Only control
messages (hello, end) wait, and only for a bounded time.
"""
from __future__ import annotations

import pickle
import threading
import time

import zmq

from .batch import Batch, BatchWriter

DEFAULT_HWM = 64            # batches queued on each side before the sender drops
END_TIMEOUT_MS = 30_000     # how long the runner waits to deliver its final message


class StreamSink:
    """Runner side. `send(batch)` returns False when the batch was dropped."""

    def __init__(self, endpoint: str, hwm: int = DEFAULT_HWM, ctx: zmq.Context | None = None):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.SNDHWM, max(1, hwm))
        self.sock.setsockopt(zmq.LINGER, END_TIMEOUT_MS)
        self.sock.connect(endpoint)
        self.dropped = 0
        self.sent = 0

    def send(self, batch: Batch) -> bool:
        batch.dropped = self.dropped
        try:
            self.sock.send_multipart(batch.encode(), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.dropped += batch.n
            return False
        self.sent += batch.n
        return True

    def control(self, message: str, **fields) -> bool:
        """hello / meta / end: waits up to END_TIMEOUT_MS, since these must arrive."""
        head = {**fields, "kind": message, "dropped": self.dropped}
        self.sock.setsockopt(zmq.SNDTIMEO, END_TIMEOUT_MS)
        try:
            self.sock.send_multipart([pickle.dumps(head), b""])
            return True
        except zmq.Again:
            return False
        finally:
            self.sock.setsockopt(zmq.SNDTIMEO, -1)

    def close(self) -> None:
        self.sock.close()


class Collector:
    """Collector side: a background thread that writes batches into the store as they arrive.

    `on_control(head)` is called for hello/meta/end messages (in the collector thread).
    """

    def __init__(self, store, run_id: str, *, hwm: int = DEFAULT_HWM, on_control=None,
                 write_interval_s: float = 0.25):
        self.writer = BatchWriter(store, run_id)
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.RCVHWM, max(1, hwm))
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.on_control = on_control
        self.write_interval_s = write_interval_s
        self.ended = threading.Event()      # the runner's end message arrived
        self.end: dict | None = None
        self.messages = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"opscope-collector-{run_id}", daemon=True)

    @property
    def events(self) -> int:
        return self.writer.events

    @property
    def dropped(self) -> int:
        return self.writer.dropped

    def start(self) -> "Collector":
        self._thread.start()
        return self

    def stop(self, drain_s: float = 0.5) -> None:
        """Stop after draining what is queued (waits up to drain_s for stragglers)."""
        self._drain_s = drain_s
        self._stop.set()
        self._thread.join()
        self.sock.close()

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        pending: list[Batch] = []
        last_write = time.monotonic()
        quiet_since = None
        try:
            while True:
                if self._stop.is_set():
                    if quiet_since is None:
                        quiet_since = time.monotonic()
                    if time.monotonic() - quiet_since > getattr(self, "_drain_s", 0.5) or self.ended.is_set() \
                            and not poller.poll(0):
                        break
                got = dict(poller.poll(20))
                while got and len(pending) < 256:
                    head, payload = self.sock.recv_multipart(copy=True)
                    self.messages += 1
                    head = pickle.loads(head)
                    quiet_since = None if self._stop.is_set() else quiet_since
                    if head["kind"] == "batch":
                        pending.append(Batch.decode(head, payload))
                    else:
                        if pending:               # keep order: events before the control message
                            self.writer.write(pending)
                            pending = []
                        self.writer.note_dropped(head.get("dropped", 0))
                        if head["kind"] == "end":
                            self.end = head
                        if self.on_control:
                            self.on_control(head)
                        if head["kind"] == "end":
                            self.ended.set()
                    got = dict(poller.poll(0))
                if pending and (time.monotonic() - last_write > self.write_interval_s or len(pending) >= 256
                                or self._stop.is_set()):
                    self.writer.write(pending)
                    pending = []
                    last_write = time.monotonic()
            if pending:
                self.writer.write(pending)
        except BaseException as e:       # a store failure must reach the caller, not vanish in a thread
            self.error = e
            self.ended.set()
