"""The event parser: one event at a time. Slower than the column parser, but it takes B/E pairs and odd
types, and it is the one that says, in one line, what is wrong with a bad file."""
from __future__ import annotations

from collections import Counter

from opscope.runtime.errors import UsageError

from .chrome import GPU_CATS, GPU_OPS, EventTable, Spans, clock_origin, finish, is_collective, is_kineto_cat, \
    is_launch, is_step_span, kineto_cost, kineto_inputs, metadata, opscope_op, run_fields
from .common import as_int as _int, count as _size, index, key, number, span_ns, text, where_of
from .details import Details, count_kinds, kind_of
from .gpu import gpu_columns
from .names import op_for_aten_name


def parse_events(events: list, other, source: str, shift_ns: int = 0) -> tuple[EventTable, dict]:
    """Event by event: slower than `parse_columns`, but takes B/E pairs and odd types, and says what is wrong."""
    if any(isinstance(e, dict) and is_kineto_cat(e.get("cat")) for e in events):
        kind = "kineto"
    elif isinstance(other, dict) and other.get("opscope"):
        kind = "opscope"
    else:
        kind = "chrome"
    procs, threads = metadata(events, source)
    pids = sorted({key(e.get("pid")) for e in events if isinstance(e, dict) and e.get("ph") in ("X", "B", "E")},
                  key=str)
    cpu_pids = {key(e.get("pid", 0)) for e in events if isinstance(e, dict) and e.get("cat") == "cpu_op"}
    table = EventTable()
    imported: Counter = Counter()
    step_kinds: Counter = Counter()
    step_spans: list[tuple[int, int]] = []
    t0 = clock_origin(kind, other, source) + shift_ns
    seqs = []
    cpu, gpu, launches, other_x, py = Spans(), Spans(), Spans(), Spans(), Spans()

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
            if cat in GPU_OPS:
                gpu.add(ev, start, end)
            elif cat == "python_function":
                py.add(ev, start, end)
                continue
            elif cat != "cpu_op" and not is_collective(cat, name):
                other_x.add(ev, start, end)
                if is_launch(cat):
                    launches.add(ev, start, end)
                continue
            else:
                shapes, dtypes = kineto_inputs(args)
                flops, nbytes = kineto_cost(str(name), args)
                table.add(op=opscope_op(str(name)), node=str(name), backend="torch:cpu",
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
            if cat in GPU_CATS:
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
    finish(table, step_spans, gpu_columns(gpu, launches, cpu) if gpu.events else None,
           seqs if kind == "opscope" else None, details, cpu.events, gpu.events)
    return table, run_fields(kind, table, other, pids, imported, count_kinds(events), step_kinds, details)


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


def _ph(e):
    ph = e.get("ph") if isinstance(e, dict) else None
    return ph if isinstance(ph, str) else None
