"""Chrome trace JSON: torch.profiler's `export_chrome_trace` (Kineto), our own export, or any other.

Kineto traces: every `cpu_op` event becomes an op event. Its name (`aten::linear`) is kept as the
node, so `op_stats(by="node")` lines up with torch.profiler's `key_averages()` name for name; the
op is the opscope op that ATen packet maps to (`linear`), or the ATen name when opscope has none.
`ProfilerStep#N` spans (torch.profiler schedules) become steps. GPU-side events (kernels, memcpy,
runtime calls) are counted in the run's config but not imported: they would count every op twice.

Our own export (otherData.opscope): op events come back with their step, seq, node, module,
shapes and FLOPs; step spans and stacks are skipped.

Anything else: every complete (`X`) span and every `B`/`E` pair is an op event named as in the file.
"""
from __future__ import annotations

import re
from collections import Counter

from opscope.runtime.errors import UsageError

from .common import DTYPES, EventTable, number, shapes_json
from .names import op_for_aten_name

_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "gpu_user_annotation", "ac2g",
             "overhead", "cuda_sync"}
_PROCESS = re.compile(r"^(.*) \((.*)\)$")
_THREAD = re.compile(r"^(?:python )?thread (-?\d+)")


def is_chrome(doc) -> bool:
    return (isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)) or \
        (isinstance(doc, list) and bool(doc) and all(isinstance(e, dict) and "ph" in e for e in doc[:100]))


def parse(doc, source: str) -> tuple[EventTable, dict]:
    """-> (events, run fields: model, backend, device, steps, config)."""
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    other = doc.get("otherData") if isinstance(doc, dict) else None
    if any(isinstance(e, dict) and e.get("cat") == "cpu_op" for e in events):
        kind = "kineto"
    elif isinstance(other, dict) and other.get("opscope"):
        kind = "opscope"
    else:
        kind = "chrome"
    procs, threads = _metadata(events, source)
    pids = sorted({e.get("pid") for e in events if isinstance(e, dict) and e.get("ph") in ("X", "B", "E")},
                  key=str)
    table = EventTable()
    skipped: Counter = Counter()
    step_spans: list[tuple[int, int]] = []
    t0 = int(other.get("t0_ns") or 0) if kind == "opscope" and isinstance(other, dict) else 0
    seqs = []

    for i, ev in enumerate(_spans(events, source)):
        cat, name = ev.get("cat"), ev.get("name")
        where = f"{source}: event {i} ({name!r})"
        ts = number(ev, "ts", where)
        dur = number(ev, "dur", where, 0)
        start = t0 + round(ts * 1000)
        end = start + round(dur * 1000)
        pid, tid = ev.get("pid", 0), ev.get("tid", 0)
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        if isinstance(name, str) and name.startswith("ProfilerStep#"):
            step_spans.append((start, end))
            continue
        if kind == "kineto":
            if cat != "cpu_op":
                skipped[str(cat)] += 1
                continue
            shapes, dtypes = _kineto_inputs(args)
            table.add(op=op_for_aten_name(str(name)), node=str(name), backend="torch:cpu",
                      device="cpu" if len(pids) < 2 else f"cpu pid {pid}", thread=_int(tid), start_ns=start,
                      end_ns=end, input_shapes=shapes, input_dtypes=dtypes)
        elif kind == "opscope":
            if cat in ("step", "stack"):
                skipped[cat] += 1
                continue
            backend, device = procs.get(pid, (f"pid {pid}", ""))
            table.add(op=str(name), node=args.get("node") or str(name), backend=backend, device=device,
                      thread=threads.get((pid, tid), _int(tid)), start_ns=start, end_ns=end,
                      step=_int(args.get("step", 0)), module=args.get("module"), source=args.get("source"),
                      input_shapes=args.get("input_shapes"), input_dtypes=args.get("input_dtypes"),
                      output_shapes=args.get("output_shapes"), output_dtypes=args.get("output_dtypes"),
                      bytes=_opt_int(args.get("bytes")), flops=_opt_int(args.get("flops")),
                      fallback=bool(args.get("fallback", False)))
            seqs.append(_int(args.get("seq", len(seqs))))
        else:
            if cat in _GPU_CATS:
                skipped[str(cat)] += 1
                continue
            backend = procs.get(pid, (f"pid {pid}", ""))[0] if pid in procs else "chrome-trace"
            device = f"pid {pid}" if len(pids) > 1 else "cpu"
            table.add(op=op_for_aten_name(str(name)), node=str(name), backend=backend, device=device,
                      thread=_int(tid), start_ns=start, end_ns=end)

    if kind == "opscope":
        table.seq = seqs
    elif step_spans:
        table.steps_from_spans(step_spans)
    steps = len(set(table.cols["step"])) if len(table) else 0
    if kind == "opscope":
        model = (other.get("model") or "import") if isinstance(other, dict) else "import"
        backend = other.get("backend") or "opscope"
        device = other.get("device") or ""
    else:
        model, backend, device = "import", {"kineto": "torch.profiler", "chrome": "chrome-trace"}[kind], "cpu"
    config = {"format": kind, "pids": [str(p) for p in pids], "skipped": dict(skipped)}
    if kind == "opscope" and isinstance(other, dict):
        config["exported_run"] = other.get("run_id")
    return table, {"model": model, "backend": backend, "device": device, "steps": steps, "config": config}


def _spans(events, source):
    """Complete spans: X events as they are, B/E pairs matched per (pid, tid) into X events."""
    open_: dict = {}
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise UsageError(f"{source}: traceEvents[{i}] is {type(ev).__name__}, expected an event object")
        ph = ev.get("ph")
        if ph == "X":
            yield ev
        elif ph == "B":
            open_.setdefault((ev.get("pid"), ev.get("tid")), []).append(ev)
        elif ph == "E":
            stack = open_.get((ev.get("pid"), ev.get("tid")))
            if stack:
                b = stack.pop()
                where = f"{source}: traceEvents[{i}]"
                x = dict(b, ph="X", dur=number(ev, "ts", where) - number(b, "ts", where))
                yield x


def _metadata(events, source):
    """process_name / thread_name metadata: our own export names processes 'backend (device)'."""
    procs: dict = {}
    threads: dict = {}
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "M":
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        name = args.get("name")
        if not isinstance(name, str):
            continue
        if ev.get("name") == "process_name":
            m = _PROCESS.match(name)
            procs[ev.get("pid")] = (m.group(1), m.group(2)) if m else (name, name)
        elif ev.get("name") == "thread_name":
            m = _THREAD.match(name)
            if m:
                threads[(ev.get("pid"), ev.get("tid"))] = int(m.group(1))
    return procs, threads


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


def _int(v) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return abs(hash(v)) % (1 << 31)


def _opt_int(v):
    return None if v is None or v == "" else _int(v)
