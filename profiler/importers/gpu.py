"""What a torch.profiler trace says the GPU did: kernels, memcpys and memsets as op events of their own,
each with the host op that launched it."""
from __future__ import annotations

from collections import Counter

import numpy as np

from .chrome import GPU_OPS, Spans, arg_dicts, field_columns
from .common import as_int as _int, count as _size
from .nesting import innermost_at


def gpu_columns(gpu: Spans, launches: Spans, cpu: Spans, cpu_args: list | None = None) -> tuple[int, dict, list]:
    """Kineto's kernels, memcpys and memsets -> (n, event columns, launch time of each, for its step).

    The launching op: Kineto gives every GPU event args "External id", copied from its launch, which
    is the External id of the innermost op running on the host when it was launched; that names the
    cpu_op directly. Where it is missing or 0 (other writers; launches inside a record_function that
    is not a cpu_op), args "correlation" leads to the launch (cudaLaunchKernel, ...): its own External
    id, else the innermost cpu_op around it on its thread. The step is the one the launch falls in
    (the kernel itself may run after its ProfilerStep ended); without a launch, the kernel's own start.
    A column at a time, like `parse_columns`: a GPU trace has about as many kernels as cpu_ops.
    cpu_args: the cpu ops' args where the caller has read them already.
    """
    ids = ("correlation", "External id")
    cpu_ext = _ids([a.get("External id") for a in (arg_dicts(cpu.events) if cpu_args is None else cpu_args)])
    op_of_ext = {x: str(e.get("name")) for x, e in zip(cpu_ext, cpu.events) if x}
    lf = field_columns(launches.events, ("cat", "pid", "tid"), {"pid": 0, "tid": 0})
    la = field_columns(arg_dicts(launches.events), ids, {})
    lanes = zip(_ids(lf["pid"]), _ids(lf["tid"]))
    launch_of = dict(zip(_ids(la["correlation"]), zip(_ids(la["External id"]), lanes, launches.start)))
    launch_of.pop(None, None)
    kinds = Counter(c.rsplit("_", 1)[0] for c in lf["cat"])
    kind = kinds.most_common(1)[0][0] if kinds else "cuda"

    n = len(gpu.events)
    gf = field_columns(gpu.events, ("cat", "name", "pid", "tid"), {"pid": 0, "tid": 0})
    ga = field_columns(arg_dicts(gpu.events), ids + ("device", "stream", "bytes"), {})
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
    cols = {"op": [GPU_OPS[c] for c in gf["cat"]], "node": list(map(str, gf["name"])), "backend": [kind] * n,
            "device": [device_of[d] for d in devices],
            "thread": [_int(t if s is None else s) for s, t in zip(ga["stream"], gf["tid"])],
            "start_ns": np.asarray(gpu.start, dtype=np.int64), "end_ns": np.maximum(gpu.end, gpu.start),
            "module": module, "bytes": list(map(_size, ga["bytes"]))}
    return n, cols, launched


def _lane(ev: dict) -> tuple:
    return _id(ev.get("pid", 0)), _id(ev.get("tid", 0))


def _id(v):
    """An id (correlation, External id, pid, tid, device) as a dict key; None for what cannot be one."""
    return v if isinstance(v, (int, str)) and not isinstance(v, bool) else None


def _ids(values: list) -> list:
    return values if set(map(type, values)) <= {int, str, type(None)} else list(map(_id, values))
