"""Chrome trace JSON: torch.profiler's `export_chrome_trace` (Kineto), our own export, or any other.

Kineto traces: every `cpu_op` event becomes an op event. Its name (`aten::linear`) is kept as the
node, so `op_stats(by="node")` lines up with torch.profiler's `key_averages()` name for name; the
op is the opscope op that ATen packet maps to (`linear`), or the ATen name when opscope has none.
`ProfilerStep#N` spans (torch.profiler schedules) become steps.

What the GPU did (`kernel`, `gpu_memcpy`, `gpu_memset`) becomes op events of its own, on a track per
device and stream: backend `cuda` (or the device kind the launch calls name: `xpu_runtime` -> `xpu`),
device `cuda:<args.device>`, thread = `args.stream`, op `kernel` / `memcpy` / `memset`, node = the
kernel's name as in the file, bytes = `args.bytes`, module = the cpu_op that launched it, step = the
step it was *launched* in (see `_gpu_columns`). A stream runs one kernel at a time: its rows never nest
(depth 0), even where the us -> ns rounding makes two overlap by a nanosecond. Matmul-family ops get FLOPs
and bytes from their recorded shapes (flops.py), once per nest. Everything else the trace holds -- Python
stacks, annotations, launches, memory samples, flows, kernel args, track names -- is kept by details.py,
and what is kept nowhere is counted by kind in the run's config (`import.kinds_dropped`).

Our own export (otherData.opscope): op events come back with their step, seq, node, module,
shapes and FLOPs; step spans and stacks are skipped.

Anything else: every complete (`X`) span and every `B`/`E` pair is an op event named as in the file.

Speed: a trace of a million events is read a column at a time (`_parse_columns`: one C-level pass
per group of fields, numpy for the times). Anything it does not expect -- B/E pairs, times that are
not numbers, events that are not objects -- hands the file to the event-by-event parser, which is
also the one that says, in one line, what is wrong with a bad file.
"""
from __future__ import annotations

import re
from collections import Counter
from itertools import compress, repeat
from operator import eq, itemgetter, ne

import numpy as np
import orjson

from opscope.runtime.errors import UsageError

from .common import DTYPES, INDEX_MAX, INT64_MAX, EventTable, index, as_int as _int, count as _size, key, number, shapes_json, \
    short, span_ns, text, thread_ids, where_of
from . import typed
from .details import Details, count_kinds, kind_of, kinds_of_pairs
from .flops import MATMUL_FAMILY, cost as _matmul_cost
from .names import op_for_aten_name
from .nesting import innermost_at

_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "gpu_user_annotation", "ac2g",
             "overhead", "cuda_sync"}
_GPU_OPS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}   # Kineto category -> op
DEVICE_OPS = frozenset(_GPU_OPS.values())   # ops that ran on a device stream; their module is the op that launched them
_PROCESS = re.compile(r"^(.*) \((.*)\)$")
_THREAD = re.compile(r"^(?:python )?thread (-?\d+)")
_NS_FAST = 2.0 ** 62      # |ns| the column parser takes as they are; beyond, the event parser checks exactly
NS_MAX = 2 ** 62          # the largest |ns| a clock origin (baseTimeNanoseconds) may have
_COLLECTIVE_PREFIXES = ("gloo:", "nccl:", "mpi:", "ucc:", "xccl:", "hccl:")


def is_chrome(doc) -> bool:
    return (isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)) or \
        (isinstance(doc, list) and bool(doc) and all(isinstance(e, dict) and "ph" in e for e in doc[:100]))


def parse(doc, source: str, shift_ns: int = 0) -> tuple[EventTable, dict]:
    """-> (events, run fields: model, backend, device, steps, config). `shift_ns` moves every time (what a
    folder of per-rank traces uses to put the ranks on one clock)."""
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    other = doc.get("otherData") if isinstance(doc, dict) else None
    try:
        table, run = _parse_columns(events, other, source, shift_ns)
    except _Irregular:     # anything unusual: the event-by-event parser, which also names what is wrong
        if typed.is_typed(events):
            events = events.as_dicts()
        table, run = _parse_events(events, other, source, shift_ns)
    dist = distributed_info(doc)
    if dist is not None:
        table.rank, table.world_size = dist["rank"], dist["world_size"]
        run["config"]["distributed"] = dist
    return table, run


def distributed_info(doc) -> dict | None:
    """torch.profiler's `distributedInfo` (written when torch.distributed is initialised): {rank,
    world_size, backend}, or None when the trace has none or it is not numbers."""
    info = doc.get("distributedInfo") if isinstance(doc, dict) else None
    if not isinstance(info, dict):
        return None
    rank, world = info.get("rank"), info.get("world_size")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (rank, world)) or not 0 <= rank < world:
        return None
    return {"rank": rank, "world_size": world, "backend": text(info.get("backend")) or ""}


def is_collective(cat, name) -> bool:
    """The span a process-group backend records for a collective (`gloo:all_reduce`, `nccl:broadcast`): it runs
    on the backend's own thread for as long as the collective takes, waiting for the other ranks included,
    while the `c10d::allreduce_` cpu_op on the caller's thread only queues it."""
    return cat == "user_annotation" and isinstance(name, str) and name.startswith(_COLLECTIVE_PREFIXES)


def _op_of(name: str) -> str:
    """`aten::linear` -> `linear`; `gloo:all_reduce` -> `all_reduce` (the name opscope's own collectives have)."""
    if name.startswith(_COLLECTIVE_PREFIXES):
        return name.split(":", 1)[1]
    return op_for_aten_name(name)


def _parse_events(events: list, other, source: str, shift_ns: int = 0) -> tuple[EventTable, dict]:
    """Event by event: slower than `_parse_columns`, but takes B/E pairs and odd types, and says what is wrong."""
    if any(isinstance(e, dict) and _is_kineto_cat(e.get("cat")) for e in events):
        kind = "kineto"
    elif isinstance(other, dict) and other.get("opscope"):
        kind = "opscope"
    else:
        kind = "chrome"
    procs, threads = _metadata(events, source)
    pids = sorted({key(e.get("pid")) for e in events if isinstance(e, dict) and e.get("ph") in ("X", "B", "E")},
                  key=str)
    cpu_pids = {key(e.get("pid", 0)) for e in events if isinstance(e, dict) and e.get("cat") == "cpu_op"}
    table = EventTable()
    imported: Counter = Counter()
    step_kinds: Counter = Counter()
    step_spans: list[tuple[int, int]] = []
    t0 = _t0(kind, other, source) + shift_ns
    seqs = []
    cpu, gpu, launches, other_x, py = _Spans(), _Spans(), _Spans(), _Spans(), _Spans()

    for i, ev in enumerate(_spans(events, source)):
        cat, name = ev.get("cat"), ev.get("name")
        if not (cat is None or isinstance(cat, str)):
            cat = str(cat)
        where = where_of(source, i, name)
        start, end = span_ns(ev, where, t0)
        pid, tid = key(ev.get("pid", 0)), key(ev.get("tid", 0))
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        if is_step_span(name, cat):
            step_spans.append((start, end))
            if kind == "kineto":
                # a step span is also a user annotation, kept as a span (or a frame, where it is one)
                (py if cat == "python_function" else other_x).add(ev, start, end)
            else:
                step_kinds[kind_of(ev)] += 1
            continue
        if kind == "kineto":
            if cat in _GPU_OPS:
                gpu.add(ev, start, end)
            elif cat == "python_function":
                py.add(ev, start, end)
                continue
            elif cat != "cpu_op" and not is_collective(cat, name):
                other_x.add(ev, start, end)
                if _is_launch(cat):
                    launches.add(ev, start, end)
                continue
            else:
                shapes, dtypes = _kineto_inputs(args)
                flops, nbytes = _kineto_cost(str(name), args)
                table.add(op=_op_of(str(name)), node=str(name), backend="torch:cpu",
                          device="cpu" if len(cpu_pids) < 2 else f"cpu pid {pid}", thread=_int(tid), start_ns=start,
                          end_ns=end, input_shapes=shapes, input_dtypes=dtypes, flops=flops, bytes=nbytes)
                cpu.add(ev, start, end)
        elif kind == "opscope":
            if cat in ("step", "stack"):
                continue
            backend, device = procs.get(pid, (f"pid {pid}", ""))
            table.add(op=str(name), node=text(args.get("node")) or str(name), backend=backend, device=device,
                      thread=threads.get((pid, tid), _int(tid)), start_ns=start, end_ns=end,
                      step=index(args, "step", where, 0), module=text(args.get("module")),
                      source=text(args.get("source")), input_shapes=text(args.get("input_shapes")),
                      input_dtypes=text(args.get("input_dtypes")), output_shapes=text(args.get("output_shapes")),
                      output_dtypes=text(args.get("output_dtypes")), bytes=_size(args.get("bytes")),
                      flops=_size(args.get("flops")), fallback=bool(args.get("fallback", False)),
                      phase=text(args.get("phase")) or "forward", fwd_node=text(args.get("fwd_node")) or "")
            seqs.append(index(args, "seq", where, len(seqs)))
        else:
            if cat in _GPU_CATS:
                continue
            backend = procs.get(pid, (f"pid {pid}", ""))[0] if pid in procs else "chrome-trace"
            device = f"pid {pid}" if len(pids) > 1 else "cpu"
            table.add(op=op_for_aten_name(str(name)), node=str(name), backend=backend, device=device,
                      thread=_int(tid), start_ns=start, end_ns=end)
        imported[str(cat)] += 1

    details = None
    if kind == "kineto":
        nonx = [(i, e) for i, e in enumerate(events) if _ph(e) not in ("X", "B", "E")]
        details = Details(py, other_x, nonx, source)
        step_spans = step_spans or details.annotation_steps()
    _finish(table, step_spans, _gpu_columns(gpu, launches, cpu) if gpu.events else None,
            seqs if kind == "opscope" else None, details, cpu.events, gpu.events)
    return table, _run_fields(kind, table, other, pids, imported, count_kinds(events), step_kinds, details)


def _finish(table: EventTable, step_spans: list, gpu=None, seq=None, details=None, host_events=(),
            gpu_events=()) -> None:
    """Both parsers' last steps: the GPU rows after the host ones (one lane per stream: a stream runs one
    kernel at a time, so no depth, even where the us -> ns rounding makes two overlap by a nanosecond), then
    steps (or the file's own seq), then what the trace holds besides ops."""
    at = None
    n_host = len(table)
    if gpu is not None:
        n, cols, launched = gpu
        at = np.concatenate([np.asarray(table.cols["start_ns"], dtype=np.int64), np.asarray(launched, dtype=np.int64)])
        table.extend(n, cols)
        table.flat_from = n_host
    if seq is not None:
        table.seq = seq
    elif step_spans:
        table.steps_from_spans(step_spans, at)
    if details is not None:
        details.step_spans = step_spans
        details.attach(table, n_host, list(host_events), list(gpu_events))
        table.details = details


def _run_fields(kind, table, other, pids, imported, total, step_kinds, details, memory_kinds=None) -> dict:
    steps = len(set(np.asarray(table.cols["step"]).tolist())) if len(table) else 0
    if kind == "opscope":
        model = text(other.get("model") or "import") if isinstance(other, dict) else "import"
        backend = text(other.get("backend") or "opscope")
        device = text(other.get("device") or "")
    else:
        model, backend, device = "import", {"kineto": "torch.profiler", "chrome": "chrome-trace"}[kind], "cpu"
    if details is not None:
        accounting = details.config(total, imported)
    else:
        memory_kinds = memory_kinds or Counter()
        if kind == "opscope" and total.get("step") and "step" not in step_kinds:    # our step spans: the steps every op's args.step names
            step_kinds = step_kinds + Counter({"step": total["step"]})
        # process and thread names (M) name the run's tracks: backend, device and thread of every op
        names = Counter({"ph:M": total["ph:M"]}) if total.get("ph:M") else Counter()
        kept = imported + step_kinds + memory_kinds + names
        accounting = {"kinds_kept": dict(kept), "kinds_dropped": dict(total - kept),
                      "stored_as": {**{k: ["steps"] for k in step_kinds}, **{k: ["memory"] for k in memory_kinds},
                                    **{k: ["track names"] for k in names}, **{k: ["events"] for k in imported}}}
    # import: every kind of event in the file, kept (and where) or dropped, with counts; `skipped` is the
    # dropped ones again, under the name `trace import --json` prints
    config = {"format": kind, "pids": [str(p) for p in pids], "imported": dict(imported), "import": accounting,
              "skipped": accounting["kinds_dropped"]}
    if kind == "opscope" and isinstance(other, dict):
        config["exported_run"] = other.get("run_id")
    return {"model": model, "backend": backend, "device": device, "steps": steps, "config": config}


class _Irregular(Exception):
    """The trace needs the event-by-event parser (B/E pairs, odd types, errors to report)."""


def _numbers(values: list) -> np.ndarray:
    if not set(map(type, values)) <= {int, float}:
        raise _Irregular
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise _Irregular from None


def _ints(values: list) -> np.ndarray:
    """Step or seq numbers, all ints in 0..INDEX_MAX (the store's INTEGER), else the event parser says which."""
    if values and not (set(map(type, values)) <= {int} and min(values) >= 0 and max(values) <= INDEX_MAX):
        raise _Irregular
    return np.asarray(values, dtype=np.int64)


def _fields(dicts: list, keys: tuple, defaults: dict) -> dict[str, list]:
    """key -> [d.get(key, default) for d in dicts]: one C-level pass per key (itemgetter where every dict has
    the key, the usual case, else dict.get with the default)."""
    out = {}
    if dicts and typed.is_record(dicts[0]):
        return {k: typed.column(dicts, k) for k in keys}
    for k in keys:
        try:
            out[k] = list(map(itemgetter(k), dicts))
        except KeyError:
            out[k] = list(map(dict.get, dicts, repeat(k), repeat(defaults.get(k))))
    return out


def _step_mask(names: list, cats: list, of_cat) -> np.ndarray:
    """`is_step_span` of every event, asked once per distinct name (a trace has few) where names can be a set."""
    try:
        steps = {x for x in set(names) if is_step_span(x, None)}
    except TypeError:          # a name that is a list or an object
        return np.fromiter(map(is_step_span, names, cats), dtype=bool, count=len(names))
    if not steps:
        return np.zeros(len(names), dtype=bool)
    return np.fromiter(map(steps.__contains__, names), dtype=bool, count=len(names)) & \
        of_cat(lambda c: c not in _GPU_CATS)


def _picker(idx: np.ndarray, n: int):
    """list -> the items at idx, as a list (C-level itemgetter; no copy when idx is everything)."""
    if len(idx) == n:
        return lambda xs: xs
    if len(idx) == 0:
        return lambda xs: []
    get = itemgetter(*idx.tolist())
    return (lambda xs: [get(xs)]) if len(idx) == 1 else (lambda xs: list(get(xs)))


def _parse_columns(events: list, other, source: str = "", shift_ns: int = 0) -> tuple[EventTable, dict]:
    """The whole trace a column at a time: one C-level pass per field (map, compress, itemgetter), per-category
    answers spread to the events by numpy, numpy for times.

    Handles X events with numeric times (what torch.profiler and our own export write); raises
    _Irregular for anything else, and the event-by-event parser takes over.
    """
    try:
        phs = typed.column(events, "ph")       # C-level passes: no Python code per event
        kinds_of_ph = set(phs)
    except (AttributeError, TypeError):       # an event that is not an object; a "ph" that is a list
        raise _Irregular from None
    if "B" in kinds_of_ph or "E" in kinds_of_ph:
        raise _Irregular
    xs = list(compress(events, map(eq, phs, repeat("X"))))
    # the rest (instants, flows, metadata: a few percent of a trace), with their places in the file
    at = np.flatnonzero(np.fromiter(map(ne, phs, repeat("X")), dtype=bool, count=len(phs))).tolist()
    nonx = list(zip(at, _picker(np.asarray(at, dtype=np.intp), len(events))(events)))
    fields = _fields(xs, ("cat", "name", "pid", "tid", "ts", "dur"), {"pid": 0, "tid": 0, "dur": 0})
    cats, names, pid_list, tid_list = fields["cat"], fields["name"], _keys(fields["pid"]), _keys(fields["tid"])
    try:
        cat_list = list(dict.fromkeys(cats))       # in order of first appearance: the run's counts list them so
        cat_set = set(cat_list)
    except TypeError:      # a category that is a list or an object
        raise _Irregular from None
    if any(_is_kineto_cat(c) for c in cat_set):
        kind = "kineto"
    elif isinstance(other, dict) and other.get("opscope"):
        kind = "opscope"
    else:
        kind = "chrome"
    procs, threads = _metadata(list(compress(events, map(eq, phs, repeat("M")))), "")
    pids = sorted(set(pid_list), key=str)
    t0 = _t0(kind, other, source) + shift_ns
    with np.errstate(over="ignore", invalid="ignore"):      # inf and NaN fail the check below
        ts = _numbers(fields["ts"]) * 1000
        dur = _numbers(fields["dur"]) * 1000
        # times the store cannot hold (or a negative duration): the event parser names the event
        if len(ts) and not (np.abs(ts).max() < _NS_FAST and (t0 + ts + dur).max() < _NS_FAST and dur.min() >= 0
                            and abs(t0) < _NS_FAST):
            raise _Irregular
    start = t0 + np.rint(ts).astype(np.int64)
    end = start + np.rint(dur).astype(np.int64)

    # per-event masks from per-category answers: a category code per event, one numpy lookup per question
    cat_code = np.fromiter(map({c: i for i, c in enumerate(cat_list)}.__getitem__, cats), dtype=np.intp,
                           count=len(cats))

    def of_cat(pred) -> np.ndarray:
        return np.asarray([bool(pred(c)) for c in cat_list] + [False])[cat_code]
    is_step = _step_mask(names, cats, of_cat)
    if kind == "kineto":
        keep = of_cat(lambda c: c == "cpu_op")
        for i in np.flatnonzero(of_cat(lambda c: c == "user_annotation")).tolist():
            keep[i] = is_collective(cats[i], names[i])
    elif kind == "opscope":
        keep = of_cat(lambda c: c not in ("step", "stack"))
    else:
        keep = of_cat(lambda c: c not in _GPU_CATS)
    keep &= ~is_step
    step_spans = [(int(start[i]), int(end[i])) for i in np.flatnonzero(is_step).tolist()]
    step_kinds = Counter(kind_of(xs[i]) for i in np.flatnonzero(is_step).tolist()) if kind != "kineto" else Counter()
    idx = np.flatnonzero(keep)
    pick = _picker(idx, len(xs))
    kept = pick(xs)
    if all(isinstance(c, str) for c in cat_list):      # else two categories may share a text (1 and "1")
        counts = np.bincount(cat_code[idx], minlength=len(cat_list)).tolist()
        imported = Counter({c: k for c, k in zip(cat_list, counts) if k})
    else:
        imported = Counter({str(c): k for c, k in Counter(pick(cats)).items()})

    def spans(mask, arrays=False):
        at = np.flatnonzero(mask)
        if arrays:          # times that stay numpy (python frames: hundreds of thousands, only sorted)
            return _Spans(_picker(at, len(xs))(xs), start[at], end[at])
        return _Spans(_picker(at, len(xs))(xs), start[at].tolist(), end[at].tolist())
    gpu = details = None
    gpu_spans = _Spans()
    if kind == "kineto":
        if not cat_set.isdisjoint(_GPU_OPS):
            launch_cats = {c for c in cat_set if _is_launch(c)}
            gpu_spans = spans(of_cat(lambda c: c in _GPU_OPS))
            gpu = _gpu_columns(gpu_spans, spans(of_cat(lambda c: c in launch_cats)),
                               _Spans(kept, start[idx].tolist(), end[idx].tolist()))
            imported.update(str(e.get("cat")) for e in gpu_spans.events)
        py = of_cat(lambda c: c == "python_function")
        details = Details(spans(py, arrays=True), spans(~keep & ~py & ~of_cat(lambda c: c in _GPU_OPS)), nonx, source)
        step_spans = step_spans or details.annotation_steps()
    names = list(map(str, pick(names)))
    pid_list, tid_list = pick(pid_list), pick(tid_list)
    n = len(kept)

    cols: dict = {"start_ns": start[idx], "end_ns": np.maximum(end[idx], start[idx])}
    op_of: dict = {}
    if kind == "kineto":
        cols["op"] = [op_of[x] if x in op_of else op_of.setdefault(x, _op_of(x)) for x in names]
        cols["node"] = names
        cols["backend"] = ["torch:cpu"] * n
        cols["device"] = ["cpu"] * n if len(set(pid_list)) < 2 else [f"cpu pid {p}" for p in pid_list]
        cols["thread"] = thread_ids(tid_list)
        args = _arg_dicts(kept)
        io = _all_inputs(args)
        cols["input_shapes"] = [a for a, _ in io]
        cols["input_dtypes"] = [b for _, b in io]
        fb = [_kineto_cost(x, a) if x in MATMUL_FAMILY else (None, None) for x, a in zip(names, args)]
        cols["flops"] = [f for f, _ in fb]
        cols["bytes"] = [b for _, b in fb]
    elif kind == "opscope":
        args = typed.column(kept, "args")
        if typed.is_typed(events):      # typed args: every field there, absent ones at their defaults
            args = [typed.NO_ARGS if a is None else a for a in args] if None in args else args
        elif not set(map(type, args)) <= {dict}:
            args = [a if isinstance(a, dict) else {} for a in args]
        a_cols = _fields(args, ("node", "step", "seq", "module", "source", "input_shapes", "input_dtypes",
                                "output_shapes", "output_dtypes", "bytes", "flops", "fallback", "phase", "fwd_node"),
                         {"step": 0, "fallback": False, "phase": "forward", "fwd_node": ""})
        where: dict = {}
        for pt in set(zip(pid_list, tid_list)):
            pid, tid = pt
            where[pt] = procs.get(pid, (f"pid {pid}", "")) + (threads.get(pt, _int(tid)),)
        if len(where) == 1:           # one process and thread, as a graph run's export has
            (w,) = where.values()
            cols["backend"], cols["device"], cols["thread"] = [w[0]] * n, [w[1]] * n, [w[2]] * n
        else:
            lanes = [where[pt] for pt in zip(pid_list, tid_list)]
            cols["backend"] = [w[0] for w in lanes]
            cols["device"] = [w[1] for w in lanes]
            cols["thread"] = [w[2] for w in lanes]
        cols["op"] = names
        nodes = a_cols["node"]
        checked = typed.is_typed(events)        # typed args are the types below already (typed.Args)
        if not checked and not set(map(type, nodes)) <= {str, type(None)}:
            cols["node"] = [text(a) or x for a, x in zip(nodes, names)]
        elif {None, ""}.isdisjoint(set(nodes)):      # every op names its node (our export's usual case)
            cols["node"] = nodes
        else:
            cols["node"] = [a or x for a, x in zip(nodes, names)]
        cols["step"] = np.asarray(a_cols["step"], dtype=np.int64) if checked else _ints(a_cols["step"])
        for c in ("module", "source", "input_shapes", "input_dtypes", "output_shapes", "output_dtypes"):
            vals = a_cols[c]
            cols[c] = vals if checked or set(map(type, vals)) <= {str, type(None)} else list(map(text, vals))
        # a training run's export: the phase (forward / backward / optimizer) and the forward node a
        # backward op differentiates come back, so the re-imported run keeps its phase band
        for c in ("phase", "fwd_node"):
            vals = a_cols[c]
            cols[c] = vals if checked or set(map(type, vals)) <= {str} else \
                [v if isinstance(v, str) else text(v) or EventTable._DEFAULTS[c] for v in vals]
        for c in ("bytes", "flops"):
            vals = a_cols[c]
            ok = checked or set(map(type, vals)) <= {int, type(None)} and _in_range([v for v in vals if v is not None])
            cols[c] = vals if ok else list(map(_size, vals))
        fb = a_cols["fallback"]
        cols["fallback"] = fb if checked or set(map(type, fb)) <= {bool} else [bool(v) for v in fb]
        seq = a_cols["seq"]
        seq = [i if v is None else v for i, v in enumerate(seq)] if None in seq else seq
        seq = np.asarray(seq, dtype=np.int64) if checked else _ints(seq)
    else:
        cols["op"] = [op_of[x] if x in op_of else op_of.setdefault(x, op_for_aten_name(x)) for x in names]
        cols["node"] = names
        cols["backend"] = [procs.get(p, (f"pid {p}", ""))[0] if p in procs else "chrome-trace" for p in pid_list]
        cols["device"] = [f"pid {p}" for p in pid_list] if len(pids) > 1 else ["cpu"] * n
        cols["thread"] = thread_ids(tid_list)

    table = EventTable()
    table.extend(n, cols)
    _finish(table, step_spans, gpu, seq if kind == "opscope" else None, details, kept, gpu_spans.events)
    memory_kinds = Counter()
    try:
        # (category, phase) -> events: the X events' from their category codes, the rest one by one
        pairs = Counter({(c, "X"): k for c, k in zip(cat_list, np.bincount(cat_code, minlength=len(cat_list)).tolist())
                         if k})
        pairs.update(zip(typed.column([e for _, e in nonx], "cat"), [phs[i] for i, _ in nonx]))
        every_kind = kinds_of_pairs(pairs)
    except TypeError:           # a category that is a list or an object
        pairs, every_kind = None, count_kinds(events, phs)
    if kind == "opscope":
        counters = [e for i, e in nonx if phs[i] == "C"]
        table.memory = _live_memory(counters, procs, t0, cols, seq)
        if table.memory is not None:
            memory_kinds = kinds_of_pairs(pairs, "C") if pairs is not None else \
                count_kinds(counters, ["C"] * len(counters))
    return table, _run_fields(kind, table, other, pids, imported, every_kind, step_kinds, details, memory_kinds)


def _live_memory(counters: list, procs: dict, t0: int, ops: dict, seq) -> dict | None:
    """Our export's "live memory" counters back into the memory table, so a re-imported run keeps its live-bytes
    track and Memory page: each sample at its process's backend, with the step and seq of the op that ended
    last at or before it. None (the counters stay counted as dropped) unless every one is well formed."""
    if not counters:
        return None
    f = _fields(counters, ("name", "pid", "ts", "args"), {"pid": 0})
    args = f["args"]
    if f["name"].count("live memory") != len(counters) or not set(map(type, args)) <= {dict, typed.Args}:
        return None
    live = typed.column(args, "live_bytes")
    if not set(map(type, live)) <= {int} or min(live) < 0 or max(live) > INT64_MAX:
        return None
    try:
        ts = _numbers(f["ts"]) * 1000
    except _Irregular:
        return None
    if not (np.abs(ts).max() < _NS_FAST and abs(t0) < _NS_FAST):
        return None
    t = t0 + np.rint(ts).astype(np.int64)
    pids = _keys(f["pid"])
    names = {p: procs[p][0] if p in procs else f"pid {p}" for p in set(pids)}
    # the op that ended last at or before each sample, on the sample's backend (compared as codes)
    codes = {b: i for i, b in enumerate(dict.fromkeys(names.values()))}
    sample_code = _codes(codes, list(map(names.__getitem__, pids)))
    op_code = _codes(codes, ops["backend"])
    step = np.zeros(len(t), dtype=np.int64)
    at = np.zeros(len(t), dtype=np.int64)
    op_end = np.asarray(ops["end_ns"], dtype=np.int64)
    op_step, op_seq = np.asarray(ops["step"], dtype=np.int64), np.asarray(seq, dtype=np.int64)
    for c in codes.values():
        mine, theirs = np.flatnonzero(sample_code == c), np.flatnonzero(op_code == c)
        if not len(theirs):
            continue
        order = theirs[np.argsort(op_end[theirs], kind="stable")]
        k = np.clip(np.searchsorted(op_end[order], t[mine], side="right") - 1, 0, None)
        step[mine], at[mine] = op_step[order[k]], op_seq[order[k]]
    none = np.ones(len(t), dtype=bool)
    backend = np.asarray(list(codes), dtype=object)[sample_code]
    return {"step": step, "seq": at, "t_ns": t, "backend": backend,
            "live_bytes": np.asarray(live, dtype=np.int64),
            "alloc_bytes": np.ma.masked_array(np.zeros(len(t), np.int64), mask=none),
            "free_bytes": np.ma.masked_array(np.zeros(len(t), np.int64), mask=none)}


def _codes(codes: dict, values) -> np.ndarray:
    """codes[v] (-1 where absent) for every value; one lookup where every value is the same object (one
    backend for a whole run)."""
    n = len(values)
    if n and (values[0] is values[-1]) and values.count(values[0]) == n:
        return np.full(n, codes.get(values[0], -1), dtype=np.int64)
    return np.fromiter(map(codes.get, values, repeat(-1)), dtype=np.int64, count=n)


def _t0(kind: str, other, source: str) -> int:
    """Our own export's times are relative to otherData.t0_ns; it goes back on to restore the run's clock."""
    if kind != "opscope" or not isinstance(other, dict):
        return 0
    v = other.get("t0_ns") or 0
    try:
        t0 = int(v)
        if abs(t0) <= INT64_MAX:
            return t0
    except (TypeError, ValueError, OverflowError):
        pass
    raise UsageError(f"{source}: otherData 't0_ns' is {short(v)}, expected a number of nanoseconds "
                     "(64-bit)") from None


def is_step_span(name, cat) -> bool:
    """A torch.profiler step span on the host; its copy on the GPU timeline (gpu_user_annotation) is not one."""
    return isinstance(name, str) and name.startswith("ProfilerStep#") and cat not in _GPU_CATS


def _is_launch(cat) -> bool:
    """Host calls that launch GPU work and carry its correlation id: cuda_runtime, cuda_driver, and their
    kin for other devices (xpu_runtime, mlu_runtime, ...)."""
    return isinstance(cat, str) and cat.endswith(("_runtime", "_driver"))


class _Spans:
    """Events of one kind, as columns: the event objects and their start and end (ns)."""

    def __init__(self, events=None, start=None, end=None):
        self.events = [] if events is None else events
        self.start = [] if start is None else start
        self.end = [] if end is None else end

    def add(self, ev: dict, start: int, end: int) -> None:
        self.events.append(ev)
        self.start.append(start)
        self.end.append(end)


def _is_kineto_cat(cat) -> bool:
    """A torch.profiler trace: host ops, or GPU activity alone (recorded with ProfilerActivity.CUDA only)."""
    return isinstance(cat, str) and (cat == "cpu_op" or cat in _GPU_OPS)


def _gpu_columns(gpu: _Spans, launches: _Spans, cpu: _Spans) -> tuple[int, dict, list]:
    """Kineto's kernels, memcpys and memsets -> (n, event columns, launch time of each, for its step).

    The launching op: Kineto gives every GPU event args "External id", copied from its launch, which
    is the External id of the innermost op running on the host when it was launched; that names the
    cpu_op directly. Where it is missing or 0 (other writers; launches inside a record_function that
    is not a cpu_op), args "correlation" leads to the launch (cudaLaunchKernel, ...): its own External
    id, else the innermost cpu_op around it on its thread. The step is the one the launch falls in
    (the kernel itself may run after its ProfilerStep ended); without a launch, the kernel's own start.
    A column at a time, like `_parse_columns`: a GPU trace has about as many kernels as cpu_ops.
    """
    ids = ("correlation", "External id")
    cpu_ext = _ids([a.get("External id") for a in _arg_dicts(cpu.events)])
    op_of_ext = {x: str(e.get("name")) for x, e in zip(cpu_ext, cpu.events) if x}
    lf = _fields(launches.events, ("cat", "pid", "tid"), {"pid": 0, "tid": 0})
    la = _fields(_arg_dicts(launches.events), ids, {})
    lanes = zip(_ids(lf["pid"]), _ids(lf["tid"]))
    launch_of = dict(zip(_ids(la["correlation"]), zip(_ids(la["External id"]), lanes, launches.start)))
    launch_of.pop(None, None)
    kinds = Counter(c.rsplit("_", 1)[0] for c in lf["cat"])
    kind = kinds.most_common(1)[0][0] if kinds else "cuda"

    n = len(gpu.events)
    gf = _fields(gpu.events, ("cat", "name", "pid", "tid"), {"pid": 0, "tid": 0})
    ga = _fields(_arg_dicts(gpu.events), ids + ("device", "stream", "bytes"), {})
    links = [launch_of.get(c) for c in _ids(ga["correlation"])]
    module = [op_of_ext.get(x) for x in _ids(ga["External id"])]
    launched = [s if link is None else link[2] for s, link in zip(gpu.start, links)]
    unlinked: dict = {}                 # the launch's (pid, tid) -> [(its time, row)]
    for row in [i for i, (m, link) in enumerate(zip(module, links)) if m is None and link is not None]:
        ext, lane, t = links[row]
        module[row] = op_of_ext.get(ext)
        if module[row] is None:
            unlinked.setdefault(lane, []).append((t, row))
    if unlinked:                        # the innermost cpu_op running on the launch's thread when it launched
        lane_code = {k: i for i, k in enumerate(unlinked)}
        op_lane = np.fromiter((lane_code.get(_lane(ev), -1) for ev in cpu.events), dtype=np.int64,
                              count=len(cpu.events))
        queries = [(lane_code[k], t, row) for k, q in unlinked.items() for t, row in q]
        ops = np.flatnonzero(op_lane >= 0)
        found = innermost_at(op_lane[ops], np.asarray(cpu.start, dtype=np.int64)[ops],
                             np.asarray(cpu.end, dtype=np.int64)[ops], [q[0] for q in queries], [q[1] for q in queries])
        for (_, _, row), k in zip(queries, found.tolist()):
            if k >= 0:
                module[row] = str(cpu.events[ops[k]].get("name"))
    devices = _ids([p if d is None else d for d, p in zip(ga["device"], gf["pid"])])    # args.device, else pid
    device_of = {d: f"{kind}:{d if isinstance(d, str) else _int(d)}" for d in set(devices)}
    cols = {"op": [_GPU_OPS[c] for c in gf["cat"]], "node": list(map(str, gf["name"])), "backend": [kind] * n,
            "device": [device_of[d] for d in devices],
            "thread": [_int(t if s is None else s) for s, t in zip(ga["stream"], gf["tid"])],
            "start_ns": np.asarray(gpu.start, dtype=np.int64), "end_ns": np.maximum(gpu.end, gpu.start),
            "module": module, "bytes": list(map(_size, ga["bytes"]))}
    return n, cols, launched


def _arg_dicts(events: list) -> list:
    args = typed.column(events, "args")
    return args if set(map(type, args)) <= {dict} else [a if isinstance(a, dict) else {} for a in args]


def _ph(e):
    ph = e.get("ph") if isinstance(e, dict) else None
    return ph if isinstance(ph, str) else None


def _keys(values: list) -> list:
    """pids / tids as dict keys (lists and objects -> their JSON text)."""
    return values if set(map(type, values)) <= {int, str} else list(map(key, values))


def _in_range(ints: list) -> bool:
    return not ints or (min(ints) >= 0 and max(ints) <= INT64_MAX)


def _lane(ev: dict) -> tuple:
    return _id(ev.get("pid", 0)), _id(ev.get("tid", 0))


def _id(v):
    """An id (correlation, External id, pid, tid, device) as a dict key; None for what cannot be one."""
    return v if isinstance(v, (int, str)) and not isinstance(v, bool) else None


def _ids(values: list) -> list:
    return values if set(map(type, values)) <= {int, str, type(None)} else list(map(_id, values))


def _spans(events, source):
    """Complete spans: X events as they are, B/E pairs matched per (pid, tid) into X events."""
    open_: dict = {}
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise UsageError(f"{source}: traceEvents[{i}] is {type(ev).__name__}, expected an event object")
        ph = _ph(ev)
        if ph == "X":
            yield ev
        elif ph == "B":
            open_.setdefault((key(ev.get("pid")), key(ev.get("tid"))), []).append(ev)
        elif ph == "E":
            stack = open_.get((key(ev.get("pid")), key(ev.get("tid"))))
            if stack:
                b = stack.pop()
                where = f"{source}: traceEvents[{i}]"
                x = dict(b, ph="X", dur=number(ev, "ts", where) - number(b, "ts", where))
                yield x


def _metadata(events, source):
    """process_name / thread_name metadata: our own export names processes 'backend (device)'. An absent pid or
    tid is 0, as for every other event (the column parser's default)."""
    procs: dict = {}
    threads: dict = {}
    for ev in events:
        if not (isinstance(ev, dict) or typed.is_record(ev)) or ev.get("ph") != "M":
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) or typed.is_record(ev.get("args")) else {}
        name = args.get("name")
        if not isinstance(name, str):
            continue
        if ev.get("name") == "process_name":
            m = _PROCESS.match(name)
            procs[key(ev.get("pid", 0))] = (m.group(1), m.group(2)) if m else (name, name)
        elif ev.get("name") == "thread_name":
            m = _THREAD.match(name)
            if m:
                threads[(key(ev.get("pid", 0)), key(ev.get("tid", 0)))] = _int(m.group(1))
    return procs, threads


def _kineto_cost(name: str, args: dict):
    """(FLOPs, bytes) of a matmul-family op from its recorded shapes, or (None, None)."""
    if name not in MATMUL_FAMILY:
        return None, None
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return None, None
    got = _matmul_cost(name, dims, [DTYPES.get(t) for t in types if isinstance(t, str)], args.get("Concrete Inputs"))
    return got if got is not None else (None, None)


def _all_inputs(args: list) -> list:
    """`_kineto_inputs` of every op's args, worked out once per distinct (Input Dims, Input type): a model
    runs the same shapes through every layer and every step."""
    seen: dict = {}
    out = []
    for a in args:
        try:
            k = orjson.dumps((a.get("Input Dims"), a.get("Input type")))
        except TypeError:         # nested past orjson's depth: worked out as it is
            out.append(_kineto_inputs(a))
            continue
        got = seen.get(k)
        out.append(got if got is not None else seen.setdefault(k, _kineto_inputs(a)))
    return out


def _kineto_inputs(args: dict):
    """'Input Dims' and 'Input type' -> JSON shapes and dtypes of the tensor inputs."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return None, None
    shapes, dtypes = [], []
    for d, t in zip(dims, types):
        dt = DTYPES.get(t) if isinstance(t, str) else None
        if dt is None or not isinstance(d, list):
            continue
        shapes.append(d)
        dtypes.append(dt)
    return shapes_json(shapes), shapes_json(dtypes)
