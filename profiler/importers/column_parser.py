"""The column parser: a whole trace a column at a time, what a million-event file needs (kineto.py says
what a trace becomes). Anything it does not expect raises `Irregular` and the event parser takes over."""
from __future__ import annotations

from collections import Counter
from itertools import compress, repeat
from operator import eq, itemgetter, ne

import numpy as np

from .chrome import GPU_CATS, GPU_OPS, EventTable, Irregular, Spans, all_inputs, arg_dicts, clock_origin, \
    field_columns, finish, is_collective, is_kineto_cat, is_launch, is_step_span, kineto_cost, \
    metadata, opscope_op, run_fields
from .common import INDEX_MAX, INT64_MAX, as_int as _int, count as _size, in_range, key, text, thread_ids
from . import typed
from .details import Details, count_kinds, kind_of, kinds_of_pairs
from .flops import MATMUL_FAMILY
from .gpu import gpu_columns
from .names import op_for_aten_name

_NS_FAST = 2.0 ** 62      # |ns| taken as they are; beyond, the event parser checks exactly


def _numbers(values: list) -> np.ndarray:
    if not set(map(type, values)) <= {int, float}:
        raise Irregular
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise Irregular from None


def _ints(values: list) -> np.ndarray:
    """Step or seq numbers, all ints in 0..INDEX_MAX (the store's INTEGER), else the event parser says which."""
    if values and not (set(map(type, values)) <= {int} and min(values) >= 0 and max(values) <= INDEX_MAX):
        raise Irregular
    return np.asarray(values, dtype=np.int64)


def _step_mask(names: list, cats: list, of_cat) -> np.ndarray:
    """`is_step_span` of every event, asked once per distinct name (a trace has few) where names can be a set."""
    try:
        steps = {x for x in set(names) if is_step_span(x, None)}
    except TypeError:          # a name that is a list or an object
        return np.fromiter(map(is_step_span, names, cats), dtype=bool, count=len(names))
    if not steps:
        return np.zeros(len(names), dtype=bool)
    return np.fromiter(map(steps.__contains__, names), dtype=bool, count=len(names)) & \
        of_cat(lambda c: c not in GPU_CATS)


def _picker(idx: np.ndarray, n: int):
    """list -> the items at idx, as a list (C-level itemgetter; no copy when idx is everything)."""
    if len(idx) == n:
        return lambda xs: xs
    if len(idx) == 0:
        return lambda xs: []
    get = itemgetter(*idx.tolist())
    return (lambda xs: [get(xs)]) if len(idx) == 1 else (lambda xs: list(get(xs)))


def parse_columns(events: list, other, source: str = "", shift_ns: int = 0) -> tuple[EventTable, dict]:
    """The whole trace a column at a time: one C-level pass per field (map, compress, itemgetter), per-category
    answers spread to the events by numpy, numpy for times.

    Handles X events with numeric times (what torch.profiler and our own export write); raises
    Irregular for anything else, and the event-by-event parser takes over.
    """
    try:
        phs = typed.column(events, "ph")       # C-level passes: no Python code per event
        kinds_of_ph = set(phs)
    except (AttributeError, TypeError):       # an event that is not an object; a "ph" that is a list
        raise Irregular from None
    if "B" in kinds_of_ph or "E" in kinds_of_ph:
        raise Irregular
    xs = list(compress(events, map(eq, phs, repeat("X"))))
    # the rest (instants, flows, metadata: a few percent of a trace), with their places in the file
    at = np.flatnonzero(np.fromiter(map(ne, phs, repeat("X")), dtype=bool, count=len(phs))).tolist()
    nonx = list(zip(at, _picker(np.asarray(at, dtype=np.intp), len(events))(events)))
    fields = field_columns(xs, ("cat", "name", "pid", "tid", "ts", "dur"), {"pid": 0, "tid": 0, "dur": 0})
    cats, names, pid_list, tid_list = fields["cat"], fields["name"], _keys(fields["pid"]), _keys(fields["tid"])
    try:
        cat_list = list(dict.fromkeys(cats))       # in order of first appearance: the run's counts list them so
        cat_set = set(cat_list)
    except TypeError:      # a category that is a list or an object
        raise Irregular from None
    if any(is_kineto_cat(c) for c in cat_set):
        kind = "kineto"
    elif isinstance(other, dict) and other.get("opscope"):
        kind = "opscope"
    else:
        kind = "chrome"
    procs, threads = metadata(list(compress(events, map(eq, phs, repeat("M")))), "")
    pids = sorted(set(pid_list), key=str)
    t0 = clock_origin(kind, other, source) + shift_ns
    with np.errstate(over="ignore", invalid="ignore"):      # inf and NaN fail the check below
        ts = _numbers(fields["ts"]) * 1000
        dur = _numbers(fields["dur"]) * 1000
        # times the store cannot hold (or a negative duration): the event parser names the event
        if len(ts) and not (np.abs(ts).max() < _NS_FAST and (t0 + ts + dur).max() < _NS_FAST and dur.min() >= 0
                            and abs(t0) < _NS_FAST):
            raise Irregular
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
        keep = of_cat(lambda c: c not in GPU_CATS)
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
            return Spans(_picker(at, len(xs))(xs), start[at], end[at])
        return Spans(_picker(at, len(xs))(xs), start[at].tolist(), end[at].tolist())
    gpu = details = None
    gpu_spans = Spans()
    if kind == "kineto":
        op_args = typed.op_args(kept) or arg_dicts(kept)     # what the ops' args say of inputs and launches
        if not cat_set.isdisjoint(GPU_OPS):
            launch_cats = {c for c in cat_set if is_launch(c)}
            gpu_spans = spans(of_cat(lambda c: c in GPU_OPS))
            gpu = gpu_columns(gpu_spans, spans(of_cat(lambda c: c in launch_cats)),
                              Spans(kept, start[idx].tolist(), end[idx].tolist()), op_args)
            imported.update(str(e.get("cat")) for e in gpu_spans.events)
        py = of_cat(lambda c: c == "python_function")
        details = Details(spans(py, arrays=True), spans(~keep & ~py & ~of_cat(lambda c: c in GPU_OPS)), nonx, source)
        step_spans = step_spans or details.annotation_steps()
    names = list(map(str, pick(names)))
    pid_list, tid_list = pick(pid_list), pick(tid_list)
    n = len(kept)

    cols: dict = {"start_ns": start[idx], "end_ns": np.maximum(end[idx], start[idx])}
    op_of: dict = {}
    if kind == "kineto":
        cols["op"] = [op_of[x] if x in op_of else op_of.setdefault(x, opscope_op(x)) for x in names]
        cols["node"] = names
        cols["backend"] = ["torch:cpu"] * n
        cols["device"] = ["cpu"] * n if len(set(pid_list)) < 2 else [f"cpu pid {p}" for p in pid_list]
        cols["thread"] = thread_ids(tid_list)
        args = op_args
        io = all_inputs(args)
        cols["input_shapes"] = [a for a, _ in io]
        cols["input_dtypes"] = [b for _, b in io]
        fb = [kineto_cost(x, a) if x in MATMUL_FAMILY else (None, None) for x, a in zip(names, args)]
        cols["flops"] = [f for f, _ in fb]
        cols["bytes"] = [b for _, b in fb]
    elif kind == "opscope":
        args = typed.column(kept, "args")
        if typed.is_typed(events):      # typed args: every field there, absent ones at their defaults
            args = [typed.NO_ARGS if a is None else a for a in args] if None in args else args
        elif not set(map(type, args)) <= {dict}:
            args = [a if isinstance(a, dict) else {} for a in args]
        a_cols = field_columns(args, ("node", "step", "seq", "module", "source", "input_shapes", "input_dtypes",
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
            ok = checked or set(map(type, vals)) <= {int, type(None)} and in_range([v for v in vals if v is not None])
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
    finish(table, step_spans, gpu, seq if kind == "opscope" else None, details, kept, gpu_spans.events)
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
    return table, run_fields(kind, table, other, pids, imported, every_kind, step_kinds, details, memory_kinds)


def _live_memory(counters: list, procs: dict, t0: int, ops: dict, seq) -> dict | None:
    """Our export's "live memory" counters back into the memory table, so a re-imported run keeps its live-bytes
    track and Memory page: each sample at its process's backend, with the step and seq of the op that ended
    last at or before it. None (the counters stay counted as dropped) unless every one is well formed."""
    if not counters:
        return None
    f = field_columns(counters, ("name", "pid", "ts", "args"), {"pid": 0})
    args = f["args"]
    if f["name"].count("live memory") != len(counters) or not set(map(type, args)) <= {dict, typed.Args}:
        return None
    live = typed.column(args, "live_bytes")
    if not set(map(type, live)) <= {int} or min(live) < 0 or max(live) > INT64_MAX:
        return None
    try:
        ts = _numbers(f["ts"]) * 1000
    except Irregular:
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


def _keys(values: list) -> list:
    """pids / tids as dict keys (lists and objects -> their JSON text)."""
    return values if set(map(type, values)) <= {int, str} else list(map(key, values))
