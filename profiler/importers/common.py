"""What every importer shares: reading a trace file safely, the event table, nesting depth, saving.

A trace file from elsewhere is untrusted input. `read_json` refuses files over a size limit
before reading them, and turns undecodable bytes, truncated JSON and the wrong shape into one
UsageError line (exit 2). `save` creates the run only after the whole file parsed, and removes it
again if writing its events fails, so a bad file never leaves a partial run in the store.
"""
from __future__ import annotations

import gzip
import math
from itertools import repeat
from operator import itemgetter, ne
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import numpy as np
import orjson

from opscope.runtime.errors import UsageError
from opscope.runtime.safe_read import open_regular

from .nesting import nesting_depth

DEFAULT_MAX_BYTES = 2 * 1024 ** 3
MAX_BYTES_ENV = "OPSCOPE_IMPORT_MAX_BYTES"

# torch.profiler "Input type" / ONNX Runtime type names -> opscope dtype names
DTYPES = {"float": "float32", "float32": "float32", "double": "float64", "float64": "float64",
          "c10::Half": "float16", "half": "float16", "float16": "float16", "c10::BFloat16": "bfloat16",
          "bfloat16": "bfloat16", "long int": "int64", "long": "int64", "int64": "int64", "int": "int32",
          "int32": "int32", "short int": "int16", "int16": "int16", "signed char": "int8", "int8": "int8",
          "unsigned char": "uint8", "uint8": "uint8", "bool": "bool"}


def max_bytes(override: int | None = None) -> int:
    if override is not None:
        return int(override)
    env = os.environ.get(MAX_BYTES_ENV)
    if env:
        try:
            return int(float(env))
        except ValueError:
            raise UsageError(f"{MAX_BYTES_ENV}={env!r} is not a number of bytes") from None
    return DEFAULT_MAX_BYTES


def read_json(path, limit: int | None = None):
    """Parse a (possibly gzipped) JSON trace file, or raise a one-line UsageError."""
    path = Path(path)
    return _decode(path, _read(path, limit))


def read_trace(path, limit: int | None = None):
    """`read_json`, except that opscope's own export comes back with typed events (typed.py says why)."""
    from . import typed
    path = Path(path)
    data = _read(path, limit)
    doc = typed.decode(data)
    return doc if doc is not None else _decode(path, data)


def _read(path: Path, limit: int | None) -> bytes:
    data = read_bounded(path, max_bytes(limit))
    if not data.strip():
        raise UsageError(f"cannot import {path}: the file is empty")
    return data


# NOTE: msgspec, not orjson, reads JSON into dicts: typed.py decodes with msgspec too, and the two must agree
# to the value -- orjson turns an integer past 64 bits into a float, msgspec keeps it exact
JSON_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


def loads(data):
    """JSON (bytes or a buffer) -> Python objects; raises one of JSON_ERRORS."""
    return msgspec.json.decode(data)


def _decode(path: Path, data: bytes):
    try:
        return loads(data)
    except JSON_ERRORS as e:
        raise not_json(path, e) from None


def not_json(path, e: Exception) -> UsageError:
    """The one line a file that is not valid JSON gets."""
    hint = "the file is truncated" if "truncated" in str(e).lower() else "it is not a JSON trace"
    return UsageError(f"cannot import {path}: not valid JSON ({_one_line(e)}); {hint}")


# A trace's JSON gzips 5-30x; past this ratio it is zeros or a bomb, refused before it costs the limit in memory
GZIP_MAX_RATIO = 200
_GZIP_RATIO_AFTER = 64 * 1024 ** 2        # bytes out before the ratio is judged (small files may do better)
_CHUNK = 1024 ** 2


def read_bounded(path: Path, limit: int) -> bytes:
    """The file's bytes (gunzipped when it is gzip), never more than `limit` of them in memory.

    Opened the bounded way (runtime/safe_read.py): only regular files -- a FIFO would block for ever and
    /dev/zero never ends -- and its size checked before anything is read.
    """
    too_big = (f"cannot import {path}: {{}} bytes is over the import limit of {limit} bytes; "
               f"raise it with --max-bytes or {MAX_BYTES_ENV}")
    f = open_regular(path, f"cannot import {path}: the file", "give a trace file")
    try:
        with f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise UsageError(too_big.format(size))
            head = f.read(2)
            f.seek(0)             # one read of the whole file below: `head + rest` would copy it all again
            if head != b"\x1f\x8b":
                data = f.read(limit + 1)      # the file may have grown since its stat
                if len(data) > limit:
                    raise UsageError(too_big.format(f"more than {limit}"))
                return data
            return _gunzip(path, f, limit, too_big)
    except OSError as e:
        raise UsageError(f"cannot import {path}: {e.strerror or e}") from None


def _gunzip(path: Path, f, limit: int, too_big: str) -> bytes:
    """Decompress a chunk at a time, stopping at `limit` bytes out (or at a bomb's ratio)."""
    out, size = [], 0
    try:
        with gzip.GzipFile(fileobj=f) as g:
            while part := g.read(min(_CHUNK, limit + 1 - size)):
                out.append(part)
                size += len(part)
                if size > limit:
                    raise UsageError(too_big.format(f"more than {limit} (uncompressed)"))
                if size > _GZIP_RATIO_AFTER and size > GZIP_MAX_RATIO * f.tell():
                    raise UsageError(f"cannot import {path}: its gzip data expands more than {GZIP_MAX_RATIO}x "
                                     f"(a decompression bomb?); gunzip it yourself if it is a real trace")
    except (zlib.error, gzip.BadGzipFile, EOFError) as e:
        raise UsageError(f"cannot import {path}: damaged gzip data ({_one_line(e)})") from None
    return b"".join(out)


def _one_line(e) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


def number(ev: dict, key: str, where: str, default=None) -> float:
    v = ev.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        if isinstance(v, str):
            try:
                f = float(v)
                if math.isfinite(f):
                    return f
            except ValueError:
                pass
        raise UsageError(f"{where}: '{key}' is {short(v)}, expected a number (microseconds)")
    return v


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


INDEX_MAX = (1 << 31) - 1         # steps and seqs are INTEGER columns


def index(args: dict, key: str, where: str, default: int) -> int:
    """A step or seq number from an event's args: an int in 0..INDEX_MAX, else one line naming the event."""
    v = args.get(key)
    if v is None:
        v = default
    if isinstance(v, str) and v.strip().isascii() and v.strip().isdigit():
        v = int(v)
    elif isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= INDEX_MAX:
        return v
    raise UsageError(f"{where}: args '{key}' is {short(v)}, expected a {key} number (0 to {INDEX_MAX})")


def span_ns(ev: dict, where: str, t0: int = 0, end_key: str | None = None) -> tuple[int, int]:
    """An event's 'ts' and 'dur' (microseconds, numbers or numeric strings) -> (start, end) in ns, checked:
    both must fit the store's int64 nanoseconds and the duration must not be negative (one line naming the
    event otherwise; a wrapped or clipped time would be a wrong answer, not an import)."""
    ts = number(ev, "ts", where)
    dur = number(ev, "dur", where, 0)
    if dur < 0:
        raise UsageError(f"{where}: 'dur' is {short(ev.get('dur'))}, expected a duration >= 0 (microseconds)")
    start = end = None
    if abs(ts) < 1e17 and dur < 1e17:         # beyond that, the ns would not fit anyway (and floats lose the ns)
        start = t0 + round(ts * 1000)
        end = start + round(dur * 1000)
    for k, t in (("ts", start), ("dur", end)):
        if t is None or not INT64_MIN <= t <= INT64_MAX:
            raise UsageError(f"{where}: '{k}' is {short(ev.get(k))}, which puts the event outside the "
                             f"times opscope stores (64-bit nanoseconds, about +-292 years)")
    return start, end


def instant_ns(ev: dict, source: str, i: int) -> int:
    """`span_ns` of an instant (a memory sample, a flow's end): the usual case -- a number of microseconds
    well inside int64 ns -- without building the message that only a bad time needs."""
    ts = ev.get("ts")
    if type(ts) in (int, float) and abs(ts) < 1e15:       # NaN and inf fail the comparison
        return round(ts * 1000)
    return span_ns(dict(ev, dur=0), where_of(source, i, ev.get("name")))[0]


def check_other_times(events, source: str) -> None:
    """Every event's 'ts', not only the spans read as ops: an instant, a counter or a metadata event whose time
    (microseconds) passes int64 nanoseconds makes the file one no tool wrote, refused in one line naming the
    event (exit 2) like a span's. A 'ts' that is absent or not a number is left to what reads that kind."""
    from . import typed
    try:
        phs = typed.column(events, "ph")            # one C-level pass; the rest only for the few non-X events
    except (TypeError, AttributeError):             # an event that is not an object
        phs = [e.get("ph") if isinstance(e, dict) else None for e in events]
    for i in np.flatnonzero(np.fromiter(map(ne, phs, repeat("X")), dtype=bool, count=len(phs))).tolist():
        ev = events[i]
        ts = ev.get("ts") if isinstance(ev, dict) or typed.is_record(ev) else None
        if type(ts) in (int, float) and abs(ts) < 9.2e15:     # the usual case, without building a message
            continue
        if isinstance(ts, bool) or not isinstance(ts, (int, float, str)):
            continue
        try:
            float(ts)
        except (ValueError, OverflowError):
            continue
        span_ns({"ts": ts, "dur": 0}, where_of(source, i, ev.get("name")))


def where_of(source: str, i: int, name) -> str:
    return f"{source}: event {i} ({short(name)})"


def short(v) -> str:
    """A value for a one-line message: numbers and text as written (cut short), containers by their type."""
    if isinstance(v, (str, int, float)) or v is None:
        r = repr(v)
        return r if len(r) <= 60 else r[:57] + "..."
    return f"a JSON {'array' if isinstance(v, list) else 'object' if isinstance(v, dict) else type(v).__name__}"


class EventTable:
    """Imported events, kept as columns (one list or array per events column) until saved."""

    COLUMNS = ["step", "op", "node", "module", "source", "backend", "device", "thread", "start_ns", "end_ns",
               "input_shapes", "input_dtypes", "output_shapes", "output_dtypes", "bytes", "flops", "fallback",
               "phase", "fwd_node"]
    _DEFAULTS = {"step": 0, "fallback": False, "phase": "forward", "fwd_node": ""}

    def __init__(self):
        self.cols: dict[str, list] = {c: [] for c in self.COLUMNS}
        self.seq = None          # set when the file carries its own seq numbers
        self.flat_from = None    # rows from here on are on device streams: one lane each, never nested
        self.details = None      # what the trace holds besides ops (details.Details), written beside them
        self.rank, self.world_size = 0, 1     # from the trace's distributedInfo; one value for every row
        self.memory = None       # live-bytes samples as memory-table columns (our own export's counters)
        self.cut: dict[str, int] = {}    # column -> values cut (names) or dropped (shapes) by `_bounded`

    def _bounded(self, column: str, values: np.ndarray) -> np.ndarray:
        """A text column as the store may keep it: a name past MAX_NAME characters cut (a 2 MB op name is a
        hostile file, and every table, template and page that prints it would pay for it); shapes or dtypes
        that are not the JSON text of a list (a number, an object), or past MAX_SHAPES characters, dropped to
        unknown (NULL) -- what reads them expects a list. The usual column passes two C-level looks (longest
        text, first and last characters) and is kept as it is; only one that fails them is looked at per
        distinct value."""
        if not len(values):
            return values
        shapes = column in SHAPE_COLUMNS
        rows = values[:1].tolist() if values.strides == (0,) else values.tolist()   # a broadcast column: one value
        texts = list(filter(None, rows)) if None in rows or "" in rows else rows
        if not texts:
            return values
        try:          # every parser writes text (or None) here; anything else takes the slow road below
            if max(map(len, texts)) <= (MAX_SHAPES if shapes else MAX_NAME) and (not shapes or (
                    set(map(itemgetter(0), texts)) <= {"["} and set(map(itemgetter(-1), texts)) <= {"]"})):
                return values
        except TypeError:
            pass
        rows = values.tolist()
        try:
            fixed = {v: _bounded_value(v, shapes) for v in set(rows) if v is not None}
            bad = {v for v, w in fixed.items() if w is not v}
            new = [fixed[v] if v in bad else v for v in rows]
            changed = sum(map(bad.__contains__, rows))
        except TypeError:          # a value that is not text (a list): each row on its own
            new = [None if v is None else _bounded_value(v, shapes) for v in rows]
            changed = sum(1 for v, w in zip(rows, new) if w is not v)
        if not changed:
            return values
        self.cut[column] = changed
        out = np.empty(len(rows), dtype=object)
        out[:] = new
        return out

    def __len__(self):
        return len(self.cols["start_ns"])

    def add(self, *, op, node, backend, device, thread, start_ns, end_ns, step=0, module=None, source=None,
            input_shapes=None, input_dtypes=None, output_shapes=None, output_dtypes=None, bytes=None, flops=None,
            fallback=False, phase="forward", fwd_node=""):
        c = self.cols
        c["step"].append(step); c["op"].append(op); c["node"].append(node); c["module"].append(module)
        c["source"].append(source); c["backend"].append(backend); c["device"].append(device)
        c["thread"].append(thread); c["start_ns"].append(start_ns); c["end_ns"].append(max(end_ns, start_ns))
        c["input_shapes"].append(input_shapes); c["input_dtypes"].append(input_dtypes)
        c["output_shapes"].append(output_shapes); c["output_dtypes"].append(output_dtypes)
        c["bytes"].append(bytes); c["flops"].append(flops); c["fallback"].append(bool(fallback))
        c["phase"].append(phase); c["fwd_node"].append(fwd_node)

    def extend(self, n: int, cols: dict) -> None:
        """Append whole columns (lists or arrays of length n); missing ones get defaults."""
        for c in self.COLUMNS:
            new, old = (cols[c] if c in cols else [self._DEFAULTS.get(c)] * n), self.cols[c]
            if not len(old):
                self.cols[c] = new
            elif isinstance(old, np.ndarray) or isinstance(new, np.ndarray):   # times, steps: keep them arrays
                self.cols[c] = np.concatenate([np.asarray(old), np.asarray(new, dtype=np.asarray(old).dtype)])
            else:
                self.cols[c] = list(old) + list(new)

    def steps_from_spans(self, spans: list[tuple[int, int]], at=None) -> None:
        """Give each event the index of the step span (start_ns, end_ns) it starts in (or the last before it);
        `at` (one time per event) replaces the start, e.g. for GPU work, whose step is the one it was launched in."""
        if not spans:
            return
        spans = sorted(spans)
        starts = np.asarray([s for s, _ in spans], dtype=np.int64)
        at = self.cols["start_ns"] if at is None else at
        idx = np.searchsorted(starts, np.asarray(at, dtype=np.int64), side="right") - 1
        self.cols["step"] = np.maximum(idx, 0)

    def columns(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """-> (columns in EVENT_COLUMNS terms, null masks of the NULL-able integer columns), with depth
        from time nesting per thread and seq per step."""
        c = self.cols
        n = len(self)
        start = np.asarray(c["start_ns"], dtype=np.int64)
        end = np.asarray(c["end_ns"], dtype=np.int64)
        thread = np.asarray(c["thread"], dtype=np.int64)
        # one timeline per (device, thread): device carries the process when a trace has several
        devices = _objects(c["device"])
        if n and (devices == devices[0]).all():
            lane = np.unique(thread, return_inverse=True)[1].reshape(-1)
        else:
            lanes: dict = {}
            lane = np.asarray([lanes.setdefault(k, len(lanes)) for k in zip(devices.tolist(), thread.tolist())],
                              dtype=np.int64)
        if self.flat_from is None:
            depth = nesting_depth(lane, start, end)
        else:
            h = self.flat_from
            depth = np.concatenate([nesting_depth(lane[:h], start[:h], end[:h]), np.zeros(n - h, dtype=np.int64)])
        step = np.asarray(c["step"], dtype=np.int64)
        if self.seq is not None:
            seq = np.asarray(self.seq, dtype=np.int64)
        else:
            order = np.lexsort((~end, start, step))      # ~end: longest first, no int64 wraps
            seq = np.empty(n, dtype=np.int64)
            if n:
                s_sorted = step[order]
                first = np.concatenate(([0], np.flatnonzero(np.diff(s_sorted)) + 1))
                rank = np.arange(n) - np.repeat(first, np.diff(np.concatenate((first, [n]))))
                seq[order] = rank
        out = {"step": step, "seq": seq, "thread": thread, "depth": depth, "start_ns": start, "end_ns": end,
               "fallback": np.asarray(c["fallback"], dtype=bool), "device": devices,
               "rank": np.full(n, self.rank, dtype=np.int64), "world_size": np.full(n, self.world_size, dtype=np.int64)}
        for k in ("op", "node", "module", "source", "backend", "input_shapes", "input_dtypes", "output_shapes",
                  "output_dtypes", "phase", "fwd_node"):
            out[k] = _objects(c[k])
        for k in NAME_COLUMNS + SHAPE_COLUMNS:
            out[k] = self._bounded(k, out[k])
        nulls = {"live_bytes": np.ones(n, dtype=bool)}
        out["live_bytes"] = np.zeros(n, dtype=np.int64)
        for k in ("bytes", "flops"):
            out[k], nulls[k] = _nullable_ints(c[k])
        return out, nulls


# names (op, node, module path, source line, backend, device, phase): kernels' C++ names run to a few
# thousand characters, module paths to a few hundred; past this a name is cut, ending in CUT_MARK
MAX_NAME = 4096
MAX_SHAPES = 64 * 1024    # the JSON text of one op's input (or output) shapes / dtypes
CUT_MARK = "…"
NAME_COLUMNS = ("op", "node", "module", "source", "backend", "device", "phase", "fwd_node")
SHAPE_COLUMNS = ("input_shapes", "input_dtypes", "output_shapes", "output_dtypes")


def _bounded_value(v, shapes: bool):
    """`v` itself when it may be stored as it is, else what is stored instead (EventTable._bounded)."""
    if not isinstance(v, str):
        v = text(v)
    if not shapes:
        return v if len(v) <= MAX_NAME else v[:MAX_NAME - len(CUT_MARK)] + CUT_MARK
    if len(v) > MAX_SHAPES or not v.lstrip().startswith("["):
        return None
    try:
        return v if isinstance(loads(v), list) else None
    except JSON_ERRORS:
        return None


def _objects(values) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == object:
        return values
    n = len(values)
    if n and isinstance(values, list) and _one_text(values):
        # one text in every row (a backend, a phase): a read-only view of it, no copy of a million
        # references -- the store writes such a column as one parameter (store._constant_text)
        one = np.empty(1, dtype=object)
        one[0] = values[0]
        return np.broadcast_to(one, (n,))
    arr = np.empty(n, dtype=object)
    arr[:] = values
    return arr


def _one_text(values: list) -> bool:
    """Whether a list holds one text (or None) in every row; two probes tell most that vary at once."""
    first = values[0]
    if not (first is None or type(first) is str) or values[-1] != first or values[len(values) // 2] != first:
        return False
    return values.count(first) == len(values)


def _nullable_ints(values) -> tuple[np.ndarray, np.ndarray]:
    """A column of ints and Nones -> (int64 values with 0 for None, True where None)."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        return values.astype(np.int64), np.zeros(len(values), dtype=bool)
    try:
        return np.asarray(values, dtype=np.int64), np.zeros(len(values), dtype=bool)
    except (TypeError, ValueError):
        null = np.asarray([v is None for v in values], dtype=bool)
        return np.asarray([0 if v is None else v for v in values], dtype=np.int64), null


def shapes_json(shapes) -> str | None:
    return None if shapes is None else text(shapes)


def save(store, table: EventTable | list[EventTable], *, model: str, backend: str, device: str, source: str,
         config: dict, steps: int) -> str:
    """Create the run and write its events (one table, or one per rank of a multi-rank run: each keeps its
    own nesting, seq and details); on any failure the run is removed again."""
    tables = table if isinstance(table, list) else [table]
    if not sum(map(len, tables)):
        raise UsageError(f"cannot import {source}: it holds no operator events to import")
    parts = [t.columns() for t in tables]
    cut: dict = {}
    for t in tables:
        for k, n in t.cut.items():
            cut[k] = cut.get(k, 0) + n
    if cut:         # what `trace import` says it changed: names cut, shapes dropped (EventTable._bounded)
        config = {**config, "cut": {"names": {k: n for k, n in cut.items() if k in NAME_COLUMNS}, "max_name": MAX_NAME,
                                    "shapes": {k: n for k, n in cut.items() if k in SHAPE_COLUMNS},
                                    "max_shapes": MAX_SHAPES}}
    if len(parts) == 1:        # one table: its columns as they are (a copy of a million rows is not free)
        cols, nulls = dict(parts[0][0]), parts[0][1]
    else:
        cols = {k: np.concatenate([p[0][k] for p in parts]) for k in parts[0][0]}
        nulls = {k: np.concatenate([p[1][k] for p in parts]) for k in parts[0][1]}
    # every time fits int64 ns; so must the distance between any two, which every view subtracts
    first, last = int(cols["start_ns"].min()), int(cols["end_ns"].max())
    if last - first > INT64_MAX:
        raise UsageError(f"cannot import {source}: its events span {(last - first) / 3.156e16:.0f} years "
                         f"(from {first} to {last} ns); opscope keeps a run within 292 years")
    # one open of the store for the whole save: creating, writing and finishing the run share it (the
    # calls below open connections of their own, which an open one makes cheap)
    with store.connect() as con:
        run_id = store.create_run(model=model, backend=backend, device=device, engine="import", steps=steps,
                                  config=config, source=source)
        try:
            # unknown integers (bytes, FLOPs, live bytes) go in as NULL: masked entries of a masked array
            for k, null in nulls.items():
                cols[k] = np.ma.masked_array(cols[k], mask=null)
            # the events on a second connection while this one writes stacks, spans and memory: DuckDB appends
            # to two tables at once on two cores (a million rows each, most of a large import's writing time)
            cursor = con.cursor()
            try:
                with ThreadPoolExecutor(1, thread_name_prefix="opscope-import") as pool:   # its exit joins the writer
                    events = pool.submit(store.add_event_columns, run_id, cols, con=cursor)
                    try:
                        for t, (own, _) in zip(tables, parts):
                            if t.details is not None:
                                t.details.write(store, run_id, own, t.details.step_spans, con)
                            if t.memory is not None:
                                store.add_memory_columns(run_id, t.memory, con=con)
                    finally:
                        events.result()     # waits even when the writes above failed: nothing writes after removal
            finally:
                cursor.close()              # after the writer is done with it
            store.finish_run(run_id, status="ok")
        except BaseException:
            remove_run(store, run_id)
            raise
    return run_id


def remove_run(store, run_id: str) -> None:
    try:
        store.delete_run(run_id)
    except Exception:   # the original error matters more than the cleanup's
        pass


def as_int(v) -> int:
    """An id as an int: traces write tids and pids as numbers or as names ("MainThread"). Names, ids past
    64 bits and ids that are lists or objects map to a stable 31-bit number of their text (the same in
    every process: Python's own str hash is salted per process)."""
    if isinstance(v, int) and not isinstance(v, bool) and INT64_MIN <= v <= INT64_MAX:
        return v
    if isinstance(v, str):
        try:
            i = int(v)
            if INT64_MIN <= i <= INT64_MAX:
                return i
        except ValueError:
            pass
    if isinstance(v, float) and v.is_integer() and abs(v) < 2 ** 53:
        return int(v)
    if v is None or isinstance(v, bool):
        return 0
    return zlib.crc32(str(key(v)).encode()) & 0x7FFFFFFF


def thread_ids(values: list) -> list:
    """`as_int` of every pid or tid, worked out once per distinct value (a trace has a handful)."""
    try:
        ids = {v: as_int(v) for v in set(values)}
    except TypeError:            # a value that is a list or an object
        return list(map(as_int, values))
    return list(map(ids.__getitem__, values))


def key(v):
    """An id (pid, tid, correlation) as a dict key: itself when it is a number or a name, else its JSON text."""
    if isinstance(v, (int, str, float)) or v is None:
        return v
    return text(v)


def text(v) -> str | None:
    """A text field (node, module, shapes as JSON text): text as it is; anything else as its JSON."""
    if v is None or isinstance(v, str):
        return v
    try:
        return orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:          # nested past orjson's depth: still one deterministic text
        return f"<{type(v).__name__}>"


def in_range(ints: list) -> bool:
    """Whether every one of these ints is a count the store holds (0..int64): one C-level pass for a column."""
    return not ints or (min(ints) >= 0 and max(ints) <= INT64_MAX)


def count(v) -> int | None:
    """A byte or FLOP count, or None where the trace gives none (or nonsense: negative, past 64 bits)."""
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            return None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= INT64_MAX
    return int(v) if ok else None
