"""What both Chrome-trace parsers share: the vocabulary of torch.profiler's categories, the clock, track
names, the launching op's inputs and cost, and the last steps that turn parsed spans into a run
(`finish`, `run_fields`). kineto.py says what a trace becomes; column_parser.py and event_parser.py are
the two ways of reading one."""
from __future__ import annotations

import re
from collections import Counter
from itertools import repeat
from operator import itemgetter

import numpy as np
import orjson

from opscope.runtime.errors import UsageError

from .common import DTYPES, INT64_MAX, EventTable, as_int as _int, key, shapes_json, short, text
from . import typed
from .flops import MATMUL_FAMILY, cost as _matmul_cost
from .names import op_for_aten_name

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "gpu_user_annotation", "ac2g",
            "overhead", "cuda_sync"}
GPU_OPS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}   # Kineto category -> op
DEVICE_OPS = frozenset(GPU_OPS.values())   # ops that ran on a device stream; their module is the op that launched them
_PROCESS = re.compile(r"^(.*) \((.*)\)$")
_THREAD = re.compile(r"^(?:python )?thread (-?\d+)")
NS_MAX = 2 ** 62          # the largest |ns| a clock origin (baseTimeNanoseconds) may have
_COLLECTIVE_PREFIXES = ("gloo:", "nccl:", "mpi:", "ucc:", "xccl:", "hccl:")


def is_collective(cat, name) -> bool:
    """The span a process-group backend records for a collective (`gloo:all_reduce`, `nccl:broadcast`): it runs
    on the backend's own thread for as long as the collective takes, waiting for the other ranks included,
    while the `c10d::allreduce_` cpu_op on the caller's thread only queues it."""
    return cat == "user_annotation" and isinstance(name, str) and name.startswith(_COLLECTIVE_PREFIXES)


def opscope_op(name: str) -> str:
    """`aten::linear` -> `linear`; `gloo:all_reduce` -> `all_reduce` (the name opscope's own collectives have)."""
    if name.startswith(_COLLECTIVE_PREFIXES):
        return name.split(":", 1)[1]
    return op_for_aten_name(name)


def finish(table: EventTable, step_spans: list, gpu=None, seq=None, details=None, host_events=(),
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


def run_fields(kind, table, other, pids, imported, total, step_kinds, details, memory_kinds=None) -> dict:
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


class Irregular(Exception):
    """The trace needs the event-by-event parser (B/E pairs, odd types, errors to report)."""


def clock_origin(kind: str, other, source: str) -> int:
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
    return isinstance(name, str) and name.startswith("ProfilerStep#") and cat not in GPU_CATS


def is_launch(cat) -> bool:
    """Host calls that launch GPU work and carry its correlation id: cuda_runtime, cuda_driver, and their
    kin for other devices (xpu_runtime, mlu_runtime, ...)."""
    return isinstance(cat, str) and cat.endswith(("_runtime", "_driver"))


class Spans:
    """Events of one kind, as columns: the event objects and their start and end (ns)."""

    def __init__(self, events=None, start=None, end=None):
        self.events = [] if events is None else events
        self.start = [] if start is None else start
        self.end = [] if end is None else end

    def add(self, ev: dict, start: int, end: int) -> None:
        self.events.append(ev)
        self.start.append(start)
        self.end.append(end)


def is_kineto_cat(cat) -> bool:
    """A torch.profiler trace: host ops, or GPU activity alone (recorded with ProfilerActivity.CUDA only)."""
    return isinstance(cat, str) and (cat == "cpu_op" or cat in GPU_OPS)


def arg_dicts(events: list) -> list:
    args = typed.column(events, "args")
    return args if set(map(type, args)) <= {dict} else [a if isinstance(a, dict) else {} for a in args]


def metadata(events, source):
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


def kineto_cost(name: str, args: dict):
    """(FLOPs, bytes) of a matmul-family op from its recorded shapes, or (None, None)."""
    if name not in MATMUL_FAMILY:
        return None, None
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return None, None
    got = _matmul_cost(name, dims, [DTYPES.get(t) for t in types if isinstance(t, str)], args.get("Concrete Inputs"))
    return got if got is not None else (None, None)


def all_inputs(args: list) -> list:
    """`kineto_inputs` of every op's args, worked out once per distinct (Input Dims, Input type): a model
    runs the same shapes through every layer and every step."""
    seen: dict = {}
    out = []
    for a in args:
        try:
            k = a.inputs_key() if isinstance(a, typed.OpArgs) else orjson.dumps((a.get("Input Dims"),
                                                                                 a.get("Input type")))
        except TypeError:         # nested past orjson's depth: worked out as it is
            out.append(kineto_inputs(a))
            continue
        got = seen.get(k)
        out.append(got if got is not None else seen.setdefault(k, kineto_inputs(a)))
    return out


def kineto_inputs(args: dict):
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


def field_columns(dicts: list, keys: tuple, defaults: dict) -> dict[str, list]:
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
