"""The live event stream: runner -> collector over ZeroMQ PUSH/PULL, on a socket only its runner can use.

The sender never blocks the model: it sends with NOBLOCK under a small high-water mark. When the
queue is full the batch is dropped and its events counted; every later message carries the
cumulative count, so the store always knows how many events it does not have. Only control
messages (hello, meta, end) wait, and only for a bounded time.

Who may talk to a collector. Three locks, because each covers what the others do not:
- the socket is `ipc://` in a fresh 0700 folder (tempfile.mkdtemp), so the kernel keeps other users
  out and there is no TCP port for anyone to find in `ps` or to squat after the collector is gone;
- the listening socket accepts one process: its runner. libzmq reads the connecting process's pid
  from the kernel (SO_PEERCRED) and closes any other connection at accept, before it reads a byte or
  keeps a descriptor (IPC_FILTER_PID), so the same user's other processes cannot hold descriptors
  (1,100 idle connections used to abort the collector: "Too many open files", exit 134) nor queue a
  message. The runner's pid is known before the socket binds because the runner is started first and
  learns the endpoint and key from a pipe its parent holds (runner._take_stream). Refused connections
  are counted (`refused_connections`, from a socket monitor);
- every message carries an HMAC-SHA256 under a 32-byte key made per run (wire.py), sent down that
  pipe: never in the environment (/proc/PID/environ keeps what a process was started with, whatever
  os.environ.pop does) nor on the command line. That is the lock where libzmq has no pid check
  (macOS: no SO_PEERCRED; Windows: no ipc://, the socket falls back to 127.0.0.1, and the key to the
  environment): there same-user processes can open connections, and are trusted not to. CURVE would
  add key pairs and libsodium for what a MAC does in a few lines of stdlib, about 2 GB/s with SHA-NI.
A message that fails the MAC, the decoding or the schema, or has more parts or bytes than the wire's
(wire.PART_BOUNDS: ZeroMQ's MAXMSGSIZE bounds each part, not their number), is dropped and counted
(`rejected`); the run goes on. At the end the collector compares the runner's own count with what
arrived (`verdict()`), so a message lost on the way marks the run incomplete instead of vanishing.

The way back: PUSH/PULL has none, and ZeroMQ drops what still sits in the socket when the sender
exits while the reader's queue is full. So a runner that sent its end waits, on a pipe its parent
holds (runner._take_pipe, the same one), until the collector has read it; then it exits.
"""
from __future__ import annotations

import os
import queue
import secrets
import shutil
import tempfile
import threading
import time

import zmq
from zmq.utils.monitor import parse_monitor_message

from .batch import Batch, BatchWriter
from .tail import LiveTail
from .wire import MAX_FRAME, PART_BOUNDS, BadMessage, Opener, Sealer, new_key

DEFAULT_HWM = 64            # batches queued on each side before the sender drops
MAX_PENDING = 256           # batches the collector's loop holds, and as many handed to its store writes, at most
# How long the runner waits to deliver a control message (hello, meta, end) and, on exit, what is still
# queued: the collector may be far behind on a loaded machine, and a runner never outlives its parent.
END_TIMEOUT_MS = 120_000
MAX_ERROR = 10_000          # characters of a model's error the end carries (the wire takes 1 MiB of UTF-8)
MAX_REASONS = 16            # distinct rejection reasons kept (the reasons are fixed phrases anyway)


class StreamSink:
    """Runner side. `send(batch)` returns False when the batch was dropped."""

    def __init__(self, endpoint: str, key: bytes, hwm: int = DEFAULT_HWM, ctx: zmq.Context | None = None):
        # its own context unless given one: close(flush=True) terminates it, which would wait on (or
        # break) any socket a profiled script made in the shared Context.instance()
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.sock = self.ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.SNDHWM, max(1, hwm))
        self.sock.setsockopt(zmq.LINGER, END_TIMEOUT_MS)
        self.sock.connect(endpoint)
        self.sealer = Sealer(key)
        self.dropped = 0
        self.sent = 0
        self.sent_by_step: list[int] = []     # events queued per step: the collector names the steps it misses

    def send(self, batch: Batch) -> bool:
        batch.dropped = self.dropped
        try:
            self.sock.send_multipart(self.sealer.batch(batch), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.dropped += batch.n
            return False
        self.sent += batch.n
        if batch.n:
            by_step = self.sent_by_step
            if batch.step >= len(by_step):
                by_step.extend([0] * (batch.step + 1 - len(by_step)))
            by_step[batch.step] += batch.n
        return True

    def control(self, message: str, **fields) -> bool:
        """hello / meta / end: waits up to END_TIMEOUT_MS, since these must arrive."""
        self.sock.setsockopt(zmq.SNDTIMEO, END_TIMEOUT_MS)
        try:
            self.sock.send_multipart(self.sealer.control(message, **fields, dropped=self.dropped))
            return True
        except zmq.Again:
            return False
        finally:
            self.sock.setsockopt(zmq.SNDTIMEO, -1)

    def end(self, status: str, error: str | None = None, error_kind: str | None = None) -> bool:
        """The last message: the runner's own count of every event it produced, and per step what it sent.
        The error is cut to MAX_ERROR characters: one past the wire's bound would have the end refused."""
        if error is not None and len(error) > MAX_ERROR:
            error = error[:MAX_ERROR] + " [...]"
        return self.control("end", status=status, error=error, error_kind=error_kind,
                            events=self.sent + self.dropped, sent_by_step=self.sent_by_step)

    def close(self, flush: bool = False) -> None:
        """flush=True (a runner about to exit): block until ZeroMQ's I/O thread has handed every queued
        message to the socket, up to END_TIMEOUT_MS. pyzmq does not terminate a context at interpreter
        exit, so without this a process that exits right after `end()` can take its queued end with it:
        on a loaded machine the I/O thread may not have run yet (seen in CI: "exited with code 0
        without reporting the end of the run")."""
        self.sock.close()
        if flush and self._own_ctx:
            self.ctx.term()


def _only_from(sock, pid: int) -> bool:
    """Have the socket accept connections from process `pid` only (ipc://); False where libzmq cannot."""
    try:
        sock.setsockopt(zmq.IPC_FILTER_PID, pid)      # NOTE: before bind: a listener copies the options then
    except (zmq.ZMQError, AttributeError):            # built without SO_PEERCRED (macOS), or a pyzmq without it
        return False
    return zmq.has("ipc")


def _watch_connections(sock) -> zmq.Socket:
    """A monitor of the socket's accepted and refused connections, read by the collector's loop.

    NOTE: libzmq's I/O thread blocks on a full monitor queue (its default bound is 1,000 events), and
    then stops serving the runner too: unread during a busy store write, a flood of refused
    connections would stall the stream. So the reading end is unbounded (RCVHWM 0): events are a few
    dozen bytes, and the loop drains them between two writes."""
    address = f"inproc://opscope-monitor-{secrets.token_hex(8)}"
    sock.monitor(address, zmq.EVENT_ACCEPTED | zmq.EVENT_ACCEPT_FAILED)
    monitor = sock.context.socket(zmq.PAIR)
    monitor.setsockopt(zmq.RCVHWM, 0)
    monitor.setsockopt(zmq.LINGER, 0)
    monitor.connect(address)
    return monitor


def _receive(sock) -> list[bytes]:
    """One message, part by part: BadMessage past the wire's number of parts or a part's bound.

    What does not fit is read and let go part by part (the rest of the message must leave the socket
    anyway), so this holds at most one message's worth (wire.MAX_MESSAGE) and one part more."""
    kept, parts, big = [], 0, False
    while True:
        part = sock.recv()
        if parts < len(PART_BOUNDS) and len(part) <= PART_BOUNDS[parts]:
            kept.append(part)
        else:
            big = big or parts < len(PART_BOUNDS)
        parts += 1
        if not sock.rcvmore:
            break
    if parts != len(PART_BOUNDS):
        raise BadMessage("wrong number of frames", f"{parts} parts")
    if big:
        raise BadMessage("bad frame size")
    return kept


def _bind_private(sock) -> tuple[str, str | None]:
    """(endpoint, private folder or None): ipc:// in a 0700 folder where ZeroMQ has it, else loopback TCP."""
    if zmq.has("ipc"):
        folder = tempfile.mkdtemp(prefix="opscope-")       # 0700, a fresh name: nobody else can connect
        path = os.path.join(folder, "stream")
        if len(path) < 100:                                 # sun_path holds ~104-108 bytes
            endpoint = f"ipc://{path}"
            sock.bind(endpoint)
            return endpoint, folder
        os.rmdir(folder)
    return f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}", None


def step_ranges(steps: list[int], most: int = 10) -> str:
    """[5, 6, 7, 9] -> '5-7, 9' (the first `most` ranges, then how many more)."""
    ranges: list[list[int]] = []
    for s in steps:
        if ranges and s == ranges[-1][1] + 1:
            ranges[-1][1] = s
        else:
            ranges.append([s, s])
    text = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in ranges[:most])
    return text + (f" and {len(ranges) - most} more ranges" if len(ranges) > most else "")


class _StoreWrites:
    """The collector's store writes on a thread of their own, in the order handed over. While DuckDB writes (0.3-3 s
    a transaction on a loaded machine, bench_live.py's stages) the collector goes on receiving, so the tail has
    each batch as it arrives and the socket's queue keeps draining. What queues meanwhile goes into one
    transaction. At most MAX_PENDING batches wait here (counted, not hand-overs: four hand-overs of 256 each and
    the write under way held over 2,000 batches); past that the loop keeps what it receives until it has
    MAX_PENDING of its own (handing them over waited for a store write: the tail stalled 3 s at p95 under load,
    bench_live.py), then waits: a store that cannot keep up stalls the loop, the socket's queue fills and the
    runner drops and counts, as when the loop wrote itself. After each write it pauses `gap`
    seconds: a write holds the process's store lock (store.connect), and back-to-back writes on a loaded machine
    kept the web server's reads (the header's callbacks) waiting for seconds."""

    def __init__(self, writer: BatchWriter, name: str, gap: float = 0.0):
        self.writer = writer
        self.gap = gap
        self.error: BaseException | None = None
        self._q: queue.Queue = queue.Queue()        # bounded by _held: batches handed over, not yet written
        self._held = 0
        self._room = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, batches: list[Batch], block: bool = True) -> bool:
        """Hand batches over; with block=False, False (nothing handed over) while they would make more than
        MAX_PENDING wait (with nothing waiting any hand-over is taken)."""
        self._raise()
        with self._room:
            fits = lambda: self._held == 0 or self._held + len(batches) <= MAX_PENDING   # noqa: E731
            if not block and not fits():
                return False
            self._room.wait_for(fits)
            self._held += len(batches)
        self._q.put(batches)
        return True

    def drain(self) -> None:
        """Wait until everything handed over is in the store (a control message follows its events there)."""
        self._q.join()
        self._raise()

    def close(self) -> None:
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        done = False
        while not done:
            items = [self._q.get()]
            while items[-1] is not None:
                try:
                    items.append(self._q.get_nowait())
                except queue.Empty:
                    break
            done = items[-1] is None
            try:
                batches = [b for it in items if it is not None for b in it]
                if batches and self.error is None:
                    self.writer.write(batches)
            except BaseException as e:      # the collector's loop raises it at its next hand-over
                self.error = e
            finally:
                with self._room:
                    self._held -= sum(len(it) for it in items if it is not None)
                    self._room.notify_all()
                for _ in items:
                    self._q.task_done()
            if not done and self.gap:
                time.sleep(self.gap)


class Collector:
    """Collector side: a background thread that writes batches into the store as they arrive.

    `on_control(head)` is called for hello/meta/end messages (in the collector thread). The runner
    needs `endpoint` and `key`. `runner_pid`: the only process the socket accepts (default: this one,
    a sink in the same process); `only_runner` says whether libzmq could enforce that here.
    """

    def __init__(self, store, run_id: str, *, runner_pid: int | None = None, hwm: int = DEFAULT_HWM,
                 on_control=None, write_interval_s: float = 0.25):
        self.writer = BatchWriter(store, run_id)
        self.tail = LiveTail()              # what arrived, before it is written: a live page reads it from here
        self.key = new_key()
        self._opener = Opener(self.key)
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.RCVHWM, max(1, hwm))
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)    # a peer sending a bigger part is disconnected unread
        self.only_runner = _only_from(self.sock, os.getpid() if runner_pid is None else runner_pid)
        self._monitor = _watch_connections(self.sock)
        self.connections = 0                # accepted: the runner's (once, unless it had to reconnect)
        self.refused_connections = 0        # closed at accept: not the runner's process
        self.endpoint, self._folder = _bind_private(self.sock)
        if self._folder is None:
            self.only_runner = False        # loopback TCP: the pid check is ipc's
        self.on_control = on_control
        self.write_interval_s = write_interval_s
        self.ended = threading.Event()      # the runner's end message arrived
        self.end: dict | None = None
        self.messages = 0
        self.rejected = 0                   # messages refused: not from our runner, undecodable, off-schema
        self.rejected_why: dict[str, int] = {}
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"opscope-collector-{run_id}", daemon=True)
        self._writes = _StoreWrites(self.writer, f"opscope-store-writes-{run_id}", gap=write_interval_s)

    @property
    def events(self) -> int:
        return self.writer.events

    @property
    def dropped(self) -> int:
        return self.writer.dropped

    @property
    def transport(self) -> str:
        return self.endpoint.split(":", 1)[0]

    def start(self) -> "Collector":
        self._writes.start()
        self._thread.start()
        return self

    def stop(self, drain_s: float = 0.5) -> None:
        """Stop after draining what is queued (waits up to drain_s for stragglers)."""
        self._drain_s = drain_s
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._count_connections()           # what the monitor saw until now: the counts are final
        self.sock.close()
        self._monitor.close()
        if self._folder:
            shutil.rmtree(self._folder, ignore_errors=True)

    def verdict(self) -> tuple[str | None, dict]:
        """(why the run is incomplete, or None; what the stream reports into the run's config)."""
        notes: dict = {"transport": self.transport, "rejected": self.rejected, "only_runner": self.only_runner,
                       "refused_connections": self.refused_connections}
        if self.rejected_why:
            notes["rejected_why"] = dict(self.rejected_why)
        end = self.end
        if end is None:                     # no final count to compare with (the runner died): the run failed
            return None, notes
        stored, dropped, produced = self.writer.events, self.writer.dropped, end["events"]
        got = self.writer.step_events
        short = [s for s, n in enumerate(end["sent_by_step"]) if got.get(s, 0) < n]
        if produced == stored + dropped and not short:
            return None, notes
        lost = produced - stored - dropped
        notes.update(produced=produced, missing_events=lost, missing_steps=step_ranges(short))
        where = f", in steps {step_ranges(short)}" if short else ""
        return (f"incomplete: the runner produced {produced} events but {stored} arrived and {dropped} were "
                f"counted as dropped: {lost} lost on the way{where}"), notes

    def _reject(self, e: BadMessage) -> None:
        self.rejected += 1
        if e.reason in self.rejected_why or len(self.rejected_why) < MAX_REASONS:
            self.rejected_why[e.reason] = self.rejected_why.get(e.reason, 0) + 1

    def _count_connections(self) -> None:
        while self._monitor.poll(0):
            event = parse_monitor_message(self._monitor.recv_multipart())["event"]
            if event == zmq.EVENT_ACCEPTED:
                self.connections += 1
            elif event == zmq.EVENT_ACCEPT_FAILED:
                self.refused_connections += 1

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        pending: list[Batch] = []
        last_write = time.monotonic()
        quiet_since = None
        try:
            while True:
                if self._stop.is_set():
                    if quiet_since is None:
                        quiet_since = time.monotonic()
                    if time.monotonic() - quiet_since > getattr(self, "_drain_s", 0.5) or self.ended.is_set() \
                            and not self.sock.poll(0):
                        break
                got = dict(poller.poll(20))
                if self._monitor in got:
                    self._count_connections()
                ready = self.sock in got
                while ready and len(pending) < MAX_PENDING:
                    self.messages += 1
                    try:
                        kind, msg = self._opener.open(_receive(self.sock))
                    except BadMessage as e:      # not our runner's, or not well-formed: count it, go on
                        self._reject(e)
                        continue
                    finally:
                        ready = self.sock.poll(0)
                    quiet_since = None if self._stop.is_set() else quiet_since
                    if kind == "batch":
                        self.tail.add(msg)
                        pending.append(msg)
                        continue
                    if pending:                   # keep order: events before the control message
                        self._writes.put(pending)
                        pending = []
                    self._writes.drain()
                    self.writer.note_dropped(msg["dropped"])
                    if kind == "end":
                        self.end = msg
                    if self.on_control:
                        self.on_control(msg)
                    if kind == "end":
                        self.tail.end()
                        self.ended.set()
                # the store behind: the loop goes on receiving (the tail gets each batch) and hands over later; it
                # waits on the writes only with MAX_PENDING batches pending, so memory stays bounded (2 x MAX_PENDING
                # batches) and the socket pushes back
                full = len(pending) >= MAX_PENDING
                if pending and (time.monotonic() - last_write > self.write_interval_s or full
                                or self._stop.is_set()) and self._writes.put(pending, block=full):
                    pending = []
                    last_write = time.monotonic()
            if pending:
                self._writes.put(pending)
            self._writes.drain()
        except BaseException as e:       # a store failure must reach the caller, not vanish in a thread
            self.error = e
            self.ended.set()
        finally:
            self._writes.close()
            self.tail.end()
