"""What every importer shares: reading a trace file safely, the event table, nesting depth, saving.

A trace file from elsewhere is untrusted input. `read_json` refuses files over a size limit
before reading them, and turns undecodable bytes, truncated JSON and the wrong shape into one
UsageError line (exit 2). `save` creates the run only after the whole file parsed, and removes it
again if writing its events fails, so a bad file never leaves a partial run in the store.
"""
from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path

import numpy as np
import orjson

from opscope.runtime.errors import UsageError

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
    limit = max_bytes(limit)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise UsageError(f"cannot import {path}: no such file") from None
    except OSError as e:
        raise UsageError(f"cannot import {path}: {e.strerror or e}") from None
    if path.is_dir():
        raise UsageError(f"cannot import {path}: it is a folder, give a trace file")
    too_big = (f"cannot import {path}: {{}} bytes is over the import limit of {limit} bytes; "
               f"raise it with --max-bytes or {MAX_BYTES_ENV}")
    if size > limit:
        raise UsageError(too_big.format(size))
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UsageError(f"cannot import {path}: {e.strerror or e}") from None
    if data[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=_Bytes(data)) as g:
                data = g.read(limit + 1)
        except (OSError, EOFError) as e:
            raise UsageError(f"cannot import {path}: damaged gzip data ({_one_line(e)})") from None
        if len(data) > limit:
            raise UsageError(too_big.format(f"more than {limit} (uncompressed)"))
    if not data.strip():
        raise UsageError(f"cannot import {path}: the file is empty")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        hint = "the file is truncated" if "end of" in str(e).lower() or "eof" in str(e).lower() else \
            "it is not a JSON trace"
        raise UsageError(f"cannot import {path}: not valid JSON ({_one_line(e)}); {hint}") from None


def _Bytes(data: bytes):
    import io
    return io.BytesIO(data)


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
        raise UsageError(f"{where}: '{key}' is {v!r}, expected a number (microseconds)")
    return v


class EventTable:
    """Imported events, kept as columns (one list or array per events column) until saved."""

    COLUMNS = ["step", "op", "node", "module", "source", "backend", "device", "thread", "start_ns", "end_ns",
               "input_shapes", "input_dtypes", "output_shapes", "output_dtypes", "bytes", "flops", "fallback"]
    _DEFAULTS = {"step": 0, "fallback": False}

    def __init__(self):
        self.cols: dict[str, list] = {c: [] for c in self.COLUMNS}
        self.seq = None          # set when the file carries its own seq numbers

    def __len__(self):
        return len(self.cols["start_ns"])

    def add(self, *, op, node, backend, device, thread, start_ns, end_ns, step=0, module=None, source=None,
            input_shapes=None, input_dtypes=None, output_shapes=None, output_dtypes=None, bytes=None, flops=None,
            fallback=False):
        c = self.cols
        c["step"].append(step); c["op"].append(op); c["node"].append(node); c["module"].append(module)
        c["source"].append(source); c["backend"].append(backend); c["device"].append(device)
        c["thread"].append(thread); c["start_ns"].append(start_ns); c["end_ns"].append(max(end_ns, start_ns))
        c["input_shapes"].append(input_shapes); c["input_dtypes"].append(input_dtypes)
        c["output_shapes"].append(output_shapes); c["output_dtypes"].append(output_dtypes)
        c["bytes"].append(bytes); c["flops"].append(flops); c["fallback"].append(bool(fallback))

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
        depth = nesting_depth(lane, start, end)
        step = np.asarray(c["step"], dtype=np.int64)
        if self.seq is not None:
            seq = np.asarray(self.seq, dtype=np.int64)
        else:
            order = np.lexsort((-end, start, step))
            seq = np.empty(n, dtype=np.int64)
            if n:
                s_sorted = step[order]
                first = np.concatenate(([0], np.flatnonzero(np.diff(s_sorted)) + 1))
                rank = np.arange(n) - np.repeat(first, np.diff(np.concatenate((first, [n]))))
                seq[order] = rank
        out = {"step": step, "seq": seq, "thread": thread, "depth": depth, "start_ns": start, "end_ns": end,
               "fallback": np.asarray(c["fallback"], dtype=bool), "device": devices}
        for k in ("op", "node", "module", "source", "backend", "input_shapes", "input_dtypes", "output_shapes",
                  "output_dtypes"):
            out[k] = _objects(c[k])
        nulls = {"live_bytes": np.ones(n, dtype=bool)}
        out["live_bytes"] = np.zeros(n, dtype=np.int64)
        for k in ("bytes", "flops"):
            out[k], nulls[k] = _nullable_ints(c[k])
        return out, nulls


def _objects(values) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == object:
        return values
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def _nullable_ints(values) -> tuple[np.ndarray, np.ndarray]:
    """A column of ints and Nones -> (int64 values with 0 for None, True where None)."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        return values.astype(np.int64), np.zeros(len(values), dtype=bool)
    try:
        return np.asarray(values, dtype=np.int64), np.zeros(len(values), dtype=bool)
    except (TypeError, ValueError):
        null = np.asarray([v is None for v in values], dtype=bool)
        return np.asarray([0 if v is None else v for v in values], dtype=np.int64), null


def nesting_depth(lane: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """How many spans of the same lane enclose each span (0 = top level), from times alone."""
    n = len(start)
    depth = np.zeros(n, dtype=np.int64)
    if n == 0:
        return depth
    order = np.lexsort((-end, start, lane))
    ln, st, en = lane[order], start[order], end[order]
    # flat (nothing encloses anything, e.g. our own export of a graph run): every span closes its
    # predecessor -- the predecessor ends by this start, and is not a zero-length span at its end
    prev_end, same_lane = en[:-1], ln[1:] == ln[:-1]
    closes = (prev_end <= st[1:]) & ~((prev_end == st[1:]) & (en[1:] == st[1:]))
    if (closes | ~same_lane).all():
        return depth
    order, ln, st, en = order.tolist(), ln.tolist(), st.tolist(), en.tolist()
    stack: list[int] = []          # end times of the open spans
    cur = None
    for k, i in enumerate(order):
        if ln[k] != cur:
            stack.clear()
            cur = ln[k]
        s, e = st[k], en[k]
        while stack and (stack[-1] <= s and not (stack[-1] == s and e == s)):
            stack.pop()
        depth[i] = len(stack)
        stack.append(e)
    return depth


def shapes_json(shapes) -> str | None:
    return None if shapes is None else json.dumps(shapes, separators=(",", ":"))


def save(store, table: EventTable, *, model: str, backend: str, device: str, source: str, config: dict,
         steps: int) -> str:
    """Create the run and write its events; on any failure the run is removed again."""
    if not len(table):
        raise UsageError(f"cannot import {source}: it holds no operator events to import")
    cols, nulls = table.columns()
    run_id = store.create_run(model=model, backend=backend, device=device, engine="import", steps=steps,
                              config=config, source=source)
    try:
        # unknown integers (bytes, FLOPs, live bytes) go in as NULL: masked entries of a masked array
        for k, null in nulls.items():
            cols[k] = np.ma.masked_array(cols[k], mask=null)
        store.add_event_columns(run_id, cols)
        store.finish_run(run_id, status="ok")
    except BaseException:
        _remove(store, run_id)
        raise
    return run_id


def _remove(store, run_id: str) -> None:
    try:
        store.delete_run(run_id)
    except Exception:   # the original error matters more than the cleanup's
        pass


def as_int(v) -> int:
    """An id as an int: traces write tids and pids as numbers or as names ("MainThread")."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return abs(hash(v)) % (1 << 31)
