"""What a torch.profiler trace holds besides ops, kept the way the tools users come from show it.

    details = Details(x_other, nonx, source)       # the trace's other spans and its non-span events
    step_spans = step_spans or details.annotation_steps()
    details.attach(table, n_host, host_events, gpu_events)   # after the op rows are built
    details.write(store, run_id, cols, con)        # after table.columns() gave each row its step and seq

- python_function (with_stack)  -> the stacks table (a stack track), and each op's innermost user frame
  as its `source` ("model.py:12") and its chain of `nn.Module: NAME` frames as its `module`
- user_annotation (record_function, ProfilerStep#N), gpu_user_annotation, *_runtime (cudaLaunchKernel),
  *_driver, cuda_sync, overhead, anything else with a duration -> the spans table, kind = the category
- `[memory]` instant events (profile_memory) -> the memory table, at the op that allocated
- flow events (ac2g launch -> kernel, fwdbwd) paired by id -> the flows table
- a kernel's args (grid, block, registers, shared memory, occupancy) -> kernel_args, by its (step, seq)
- thread_name / process metadata -> names of the run's tracks (config import.tracks)

What none of these takes is counted by kind in the run's config (import.kinds_dropped), never lost quietly.
"""
from __future__ import annotations

import re
import sys
from collections import Counter
from itertools import repeat

import numpy as np

from .common import as_int, count, in_range, instant_ns, key, text, thread_ids
from .nesting import ancestor_count, innermost_at, nearest_marked, nesting_depth, open_parents, sweep_order
from .typed import column, is_record

_FRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")       # "path/model.py(12): forward"
_MODULE = "nn.Module: "
# top-level packages whose frames are not the user's code (besides the standard library's own modules)
_LIBRARIES = frozenset({"torch", "torchvision", "torchaudio", "functorch", "triton", "transformers", "accelerate",
                        "timm", "numpy", "typing_extensions", "_pytest", "pytest", "pluggy", "opscope", "runtime",
                        "profiler", "lightning", "pytorch_lightning", "deepspeed", "apex", "peft", "diffusers"})
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))
# c10::DeviceType numbers, as torch.profiler writes them in [memory] events
_DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "hip", 9: "xla", 12: "xpu", 13: "mps", 15: "hpu", 19: "mtia",
                 20: "privateuseone"}
_FLOW_PHS = {"s": 0, "t": 1, "f": 1}


def kind_of(ev: dict) -> str:
    """An event's kind as the run's config counts it: its category, else its phase ("ph:M")."""
    cat = ev.get("cat")
    if isinstance(cat, str) and cat:
        return cat
    ph = ev.get("ph")
    return f"ph:{ph if isinstance(ph, str) else text(ph)}"


def count_kinds(events, phs=None) -> Counter:
    """Every event by kind; an 'E' closes its 'B' (the pair is one span). phs: each event's "ph", when the
    caller has them (then the count is one C-level pass over (category, phase) pairs)."""
    if phs is not None:
        try:
            pairs = Counter(zip(column(events, "cat"), phs))
        except TypeError:           # a category or phase that is a list or an object
            pass
        else:
            return kinds_of_pairs(pairs)
    return Counter(kind_of(e) for e in events if (isinstance(e, dict) or is_record(e)) and e.get("ph") != "E")


def kinds_of_pairs(pairs: Counter, only_ph=None) -> Counter:
    """{(category, ph): n} -> {kind: n}, as count_kinds counts them (only_ph: just the events of that phase)."""
    out: Counter = Counter()
    for (cat, ph), n in pairs.items():
        if ph != "E" and (only_ph is None or ph == only_ph):
            out[kind_of({"cat": cat, "ph": ph})] += n
    return out


def _frame_info(name) -> tuple:
    """A python_function event's name -> (user source or None, frame text, module name or None)."""
    if not isinstance(name, str):
        return None, str(name), None
    if name.startswith(_MODULE):
        return None, name, name[len(_MODULE):]
    return (*_user_frame(name), None)


def _user_frame(name: str):
    """'path/model.py(12): forward' -> ('path/model.py:12', 'forward (model.py:12)') for the user's own code;
    (None, frame text) for built-ins, the standard library and frameworks."""
    m = _FRAME.match(name)
    if not m:
        return None, name
    path, line, func = m.groups()
    frame = f"{func} ({path.rsplit('/', 1)[-1]}:{line})"
    top = path.replace("\\", "/").lstrip("./").split("/", 1)[0]
    top = top[:-3] if top.endswith(".py") else top
    lib = path.startswith("<") or top in _STDLIB or top in _LIBRARIES or "site-packages" in path \
        or "dist-packages" in path
    return (None if lib else f"{path}:{line}"), frame


# record_function names torch itself puts around its own work: never a user's step
_TORCH_ANNOTATIONS = ("Optimizer.", "DistributedDataParallel.", "FullyShardedDataParallel", "FSDP::", "fsdp:",
                      "## ", "torch/", "aten::", "autograd::", "c10d::", "nccl:", "gloo:", "ProfilerStep#")


class Details:
    def __init__(self, py, x_other, nonx: list, source: str):
        """py: the trace's python_function spans (chrome.Spans: events, start, end); x_other: its other spans
        that are not ops; nonx: (index, event) of every event that is not a span (instants, flows, metadata)."""
        self.source = source
        self.kept: Counter = Counter()
        self.stored_as: dict[str, set] = {}
        self.py = (py.events, py.start, py.end)
        ev, st, en = x_other.events, x_other.start, x_other.end
        cats = [c if type(c) is str and c else kind_of(e) for c, e in zip(column(ev, "cat"), ev)]
        self.spans = (ev, st, en, cats)
        # read now, while parsing: a typed event's args are decoded when read, and one that does not decode
        # must refuse the file before anything is written (kineto.parse)
        self.span_args = column(ev, "args")
        self._keep("python_function", "stacks", len(py.events))
        for c, n in Counter(cats).items():
            self._keep(c, "spans", n)
        self.nonx = nonx
        self.memory: list = []
        self.flows: list = []
        self.kernel_rows: list = []
        self.tracks: list = []

    def _keep(self, kind: str, table: str, n: int = 1) -> None:
        if n:
            self.kept[kind] += n
            self.stored_as.setdefault(kind, set()).add(table)

    def annotation_steps(self) -> list[tuple[int, int]]:
        """Without ProfilerStep#N: the optimizer's steps when the trace has them (torch annotates each
        `Optimizer.step#SGD.step`; a step ends where one ends), else the outermost user annotations on the
        host that are the user's own, when there are several (a loop of `with record_function("step")`).
        NOTE: torch's own annotations (Optimizer.zero_grad, DistributedDataParallel.forward, ...) are
        outermost too: counted as steps, six iterations of a DDP script read as eighteen steps."""
        ev, st, en, cats = self.spans
        rows = [i for i, c in enumerate(cats) if c == "user_annotation"]
        if len(rows) < 2:
            return []
        names = [str(ev[i].get("name", "")) for i in rows]
        opt = [i for i, name in zip(rows, names) if name.startswith("Optimizer.step#")]
        if len(opt) >= 2:
            lane = max({as_int(ev[i].get("tid", 0)) for i in opt},
                       key=lambda t: sum(as_int(ev[i].get("tid", 0)) == t for i in opt))
            ends = sorted(int(en[i]) for i in opt if as_int(ev[i].get("tid", 0)) == lane)
            first = min(int(st[i]) for i in rows)
            return [(first if k == 0 else ends[k - 1], e) for k, e in enumerate(ends)]
        rows = [i for i, name in zip(rows, names) if not name.startswith(_TORCH_ANNOTATIONS)]
        if len(rows) < 2:
            return []
        lanes = np.asarray([as_int(ev[i].get("tid", 0)) for i in rows], dtype=np.int64)
        s = np.asarray([st[i] for i in rows], dtype=np.int64)
        e = np.asarray([en[i] for i in rows], dtype=np.int64)
        top = nesting_depth(lanes, s, e) == 0
        out = [(int(a), int(b)) for a, b, t in zip(s, e, top) if t]
        return out if len(out) >= 2 else []

    # --- with the op rows ----------------------------------------------------------------------------
    def attach(self, table, n_host: int, host_events: list, gpu_events: list) -> None:
        """Link what needs the op rows: sources and modules of host ops (python stacks), FLOPs counted once
        per nest, memory samples at the op that allocated, flows at the events they join, kernel args."""
        self.table, self.n_host = table, n_host
        try:
            c = table.cols
            thread = np.asarray(c["thread"], dtype=np.int64)
            start = np.asarray(c["start_ns"], dtype=np.int64)
            end = np.asarray(c["end_ns"], dtype=np.int64)
            self._stacks_and_sources(thread[:n_host], start[:n_host], end[:n_host])
            self._memory(thread[:n_host], start[:n_host], end[:n_host])
            self.lanes = lanes = self._lanes(table, host_events, gpu_events)
            self._flows(lanes, host_events, gpu_events, start)
            self._kernels(gpu_events)
            self._tracks(lanes)
        finally:
            # NOTE: the table holds these details (table.details): kept, the pair is a reference cycle that
            # only the garbage collector frees -- after an import, a full collection over every event
            # dict the details still reference (3 s of a 1M-event Kineto import)
            self.table = None
            # the Python frames and the non-span events are read: dropped, so they are freed with the trace
            # (most of a with_stack trace), not with the table after the store is written
            self.py = self.nonx = None

    def _stacks_and_sources(self, thread, start, end) -> None:
        """Python frames and host ops nested by time per thread (nesting.py): each op's source is the innermost
        user frame around it, its module the chain of `nn.Module: NAME` frames around it; each frame's depth
        the number of frames around it."""
        ev, pst, pen = self.py
        c = self.table.cols
        flops = c["flops"]
        nested_flops = [i for i in range(self.n_host) if flops[i] is not None]
        if not ev and not nested_flops:
            self.stack_rows = None
            return
        # a trace repeats a few hundred frames hundreds of thousands of times: each is read once, by its code
        names = column(ev, "name")
        keys = names if set(map(type, names)) <= {str} else [n if type(n) is str else (type(n), key(n)) for n in names]
        vocab: dict = {}
        code = np.fromiter(map(vocab.setdefault, keys, map(len, repeat(vocab))), dtype=np.int64, count=len(keys)) \
            if keys else np.zeros(0, dtype=np.int64)
        firsts = dict(zip(keys[::-1], names[::-1]))        # each key's first name as written
        infos = [_frame_info(firsts[k]) for k in vocab]
        users = [u for u, _, _ in infos]
        mods = [m for _, _, m in infos]
        pth = thread_ids(column(ev, "tid", 0))
        # frames (kind 0) open before ops (kind 1) that start with them
        n_py = len(ev)
        th = np.concatenate([np.asarray(pth, dtype=np.int64), np.asarray(thread, dtype=np.int64)])
        st = np.concatenate([np.asarray(pst, dtype=np.int64), np.asarray(start, dtype=np.int64)])
        en = np.concatenate([np.asarray(pen, dtype=np.int64), np.asarray(end, dtype=np.int64)])
        kinds = np.concatenate([np.zeros(n_py, dtype=np.int64), np.ones(self.n_host, dtype=np.int64)])
        idx = np.concatenate([np.arange(n_py, dtype=np.int64), np.arange(self.n_host, dtype=np.int64)])
        order = sweep_order(th, st, en, kinds, idx)
        parent = open_parents(th[order], st[order], en[order])
        at = idx[order]
        frame = kinds[order] == 0
        frames, op = np.flatnonzero(frame), np.flatnonzero(~frame)
        frame_code = np.full(len(order), -1, dtype=np.int64)
        frame_code[frames] = code[at[frames]]
        # what each one inherits from the frames (and ops) around it: the nearest marked one, itself included
        has_user = np.asarray([u is not None for u in users] + [False], dtype=bool)
        is_module = np.asarray([m is not None for m in mods] + [False], dtype=bool)
        user_at = nearest_marked(parent, has_user[frame_code])
        mod_at = nearest_marked(parent, is_module[frame_code])
        depth = np.zeros(n_py, dtype=np.int64)
        depth[at[frames]] = ancestor_count(parent, frame)[frames]
        # a module frame's path: its nearest enclosing module frame's, then its own name (parents sort first)
        path: dict = {}
        up_list, mod_list, code_list = parent.tolist(), mod_at.tolist(), frame_code.tolist()
        for m in np.flatnonzero(is_module[frame_code]).tolist():
            up = up_list[m]
            above = path.get(mod_list[up]) if up >= 0 else None
            name = mods[code_list[m]]
            path[m] = name if above is None else f"{above}.{name}"
        src = list(c["source"]) if not isinstance(c["source"], list) else c["source"]
        mod = list(c["module"]) if not isinstance(c["module"], list) else c["module"]
        flops, nbytes = list(flops), list(c["bytes"])
        op_rows = at[op]
        for i, u, m in zip(op_rows.tolist(), user_at[op].tolist(), mod_at[op].tolist()):
            if src[i] is None and u >= 0:
                src[i] = users[code_list[u]]
            if mod[i] is None and m >= 0:
                mod[i] = path[m]
        # FLOPs are counted once, on the outermost op of the family: an op with FLOPs inside another loses them
        if nested_flops:
            flop_mark = np.zeros(len(order), dtype=bool)
            flop_mark[op] = [flops[i] is not None for i in op_rows.tolist()]
            outer = nearest_marked(parent, flop_mark)
            up = parent[op]
            inside = flop_mark[op] & (up >= 0) & (outer[np.maximum(up, 0)] >= 0)
            for i in op_rows[inside].tolist():
                flops[i] = nbytes[i] = None
        c["source"], c["module"], c["flops"], c["bytes"] = src, mod, flops, nbytes
        self.stack_rows = (pst, pen, pth, depth, _obj([f for _, f, _ in infos])[code]) if ev else None

    def _memory(self, thread, start, end) -> None:
        """[memory] instants: live bytes after each allocation or free, at the innermost op around it.
        A column at a time: a profile_memory trace has one per allocation and one per free."""
        evs = [e for _, e in self.nonx]
        mem = [k for k, (n, p) in enumerate(zip(column(evs, "name"), column(evs, "ph")))
               if n == "[memory]" and p in ("i", "I")]
        self.memory = rows = []
        if not mem:
            return
        places = [self.nonx[k][0] for k in mem]
        evs = [evs[k] for k in mem]
        args = [a if isinstance(a, dict) else {} for a in column(evs, "args")]
        times = [round(t * 1000) if type(t) in (int, float) and abs(t) < 1e15 else instant_ns(e, self.source, i)
                 for t, e, i in zip(column(evs, "ts"), evs, places)]
        live, alloc, free = _byte_counts(list(map(dict.get, args, repeat("Bytes"))),
                                         list(map(dict.get, args, repeat("Total Allocated"))))
        backends: dict = {}           # (Device Type, Device Id) as written -> backend: a trace has one or two
        samples = []
        for dev, dev_id in zip(map(dict.get, args, repeat("Device Type"), repeat(0)),
                               map(dict.get, args, repeat("Device Id"), repeat(0))):
            code = (type(dev), key(dev), type(dev_id), key(dev_id))
            b = backends.get(code)
            if b is None:
                d = as_int(dev)
                kind = _DEVICE_TYPES.get(d, f"device{d}")
                b = backends[code] = "torch:cpu" if kind == "cpu" else f"{kind}:{as_int(dev_id)}"
            samples.append(b)
        rows.extend([t, b, v, a, f, None] for t, b, v, a, f in zip(times, samples, live, alloc, free))
        try:
            kinds = kinds_of_pairs(Counter(zip(column(evs, "cat"), column(evs, "ph"))))
        except TypeError:           # a category that is a list or an object
            kinds = Counter(map(kind_of, evs))
        for kind, n in kinds.items():
            self._keep(kind, "memory", n)
        # the innermost op around each sample, on the sample's thread
        tids = thread_ids(column(evs, "tid", 0))
        for row, op_row in zip(rows, innermost_at(thread, start, end, tids, times).tolist()):
            row[5] = op_row if op_row >= 0 else None

    def _lanes(self, table, host_events, gpu_events) -> dict:
        """(pid, tid) as written -> the track (backend, device, thread) its events went to."""
        c = table.cols
        lanes: dict = {}
        seen: set = set()
        for off, evs in ((0, host_events), (self.n_host, gpu_events)):
            for r, raw in enumerate(zip(column(evs, "pid", 0), column(evs, "tid", 0))):
                try:
                    if raw in seen:           # most events are on a lane seen already
                        continue
                    seen.add(raw)
                except TypeError:             # a pid or tid that is a list or an object
                    pass
                k = (key(raw[0]), key(raw[1]))
                if k not in lanes:
                    lanes[k] = (c["backend"][off + r], c["device"][off + r], int(c["thread"][off + r]))
        return lanes

    def _flows(self, lanes, host_events, gpu_events, start) -> None:
        """Flow events paired by (category, id): 's' leaves, 'f' (or 't') arrives."""
        ends: dict = {}
        for i, e in self.nonx:
            ph = e.get("ph")
            side = _FLOW_PHS.get(ph) if isinstance(ph, str) else None      # a phase that is a list: not a flow
            if side is None or "id" not in e:
                continue
            t = instant_ns(e, self.source, i)
            ends.setdefault((kind_of(e), key(e.get("id"))), [None, None])[side] = (e, t)
        if not ends:
            return
        # (pid, tid, start ns) -> the first op row there, to name the events an arrow joins (built backwards:
        # a later row must not replace an earlier one)
        evs = list(host_events) + list(gpu_events)
        lanes_at = zip(map(key, column(evs, "pid", 0)), map(key, column(evs, "tid", 0)), start[:len(evs)].tolist())
        at = dict(zip(reversed(list(lanes_at)), range(len(evs) - 1, -1, -1)))
        for (kind, fid), (a, b) in ends.items():
            if a is None or b is None:
                continue                 # half an arrow: counted as dropped
            row = [kind, text(fid) if not isinstance(fid, str) else fid]
            for e, t in (a, b):
                k = (key(e.get("pid", 0)), key(e.get("tid", 0)))
                track = lanes.get(k) or (None, f"pid {k[0]}", as_int(k[1]))
                row += [*track, t, at.get((*k, t))]
            self.flows.append(row)
            self._keep(kind, "flows", 2)

    def _kernels(self, gpu_events) -> None:
        for r, e in enumerate(gpu_events):
            args = e.get("args")
            if not isinstance(args, dict) or not args:
                continue
            grid, block = args.get("grid"), args.get("block")
            self.kernel_rows.append((self.n_host + r, text(grid) if grid is not None else None,
                                     text(block) if block is not None else None,
                                     count(args.get("registers per thread")), count(args.get("shared memory")),
                                     _float(args.get("blocks per SM")), _float(args.get("warps per SM")),
                                     _float(args.get("est. achieved occupancy %")), count(args.get("correlation")),
                                     text(args)))

    def _tracks(self, lanes) -> None:
        """Track names: a GPU stream is 'stream N' (what Kineto's thread_name says), a host thread its thread
        name; metadata that names nothing imported is counted as dropped."""
        names = {}
        for i, e in self.nonx:
            if e.get("ph") != "M":
                continue
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            if e.get("name") == "thread_name" and isinstance(args.get("name"), str):
                names[(key(e.get("pid", 0)), key(e.get("tid", 0)))] = args["name"].strip()
            self._keep(kind_of(e), "tracks")
        seen = set()
        for k, (backend, device, thread) in lanes.items():
            if (backend, device, thread) in seen:
                continue
            seen.add((backend, device, thread))
            host = backend == "torch:cpu"
            self.tracks.append({"backend": backend, "device": device, "thread": thread,
                                "kind": "thread" if host else "stream",
                                "name": names.get(k) or f"thread {thread}" if host else f"stream {thread}"})

    # --- writing -------------------------------------------------------------------------------------
    def config(self, total: Counter, op_kinds: Counter) -> dict:
        kept = self.kept + op_kinds
        stored = {k: sorted(v) for k, v in self.stored_as.items()}
        for k in op_kinds:
            stored[k] = sorted(set(stored.get(k, [])) | {"events"})
        return {"kinds_kept": dict(kept), "kinds_dropped": dict(total - kept), "stored_as": stored,
                "tracks": self.tracks}

    def write(self, store, run_id: str, cols: dict, step_spans, con) -> None:
        step, seq = cols["step"], cols["seq"]

        def at(rows):
            r = np.asarray([-1 if x is None else x for x in rows], dtype=np.int64)
            ok = r >= 0
            r = np.where(ok, r, 0)
            return (np.ma.masked_array(step[r] if len(step) else r, mask=~ok),
                    np.ma.masked_array(seq[r] if len(seq) else r, mask=~ok))

        if self.stack_rows is not None:
            t, e, th, d, f = self.stack_rows
            t = np.asarray(t, dtype=np.int64)
            store.add_stack_columns(run_id, {"t_ns": t, "dur_ns": np.asarray(e, dtype=np.int64) - t,
                                             "thread": np.asarray(th, dtype=np.int64),
                                             "depth": np.asarray(d, dtype=np.int64), "frame": _obj(f)}, con=con)
        ev, st, en, kinds = self.spans
        if ev:
            s = np.asarray(st, dtype=np.int64)
            e = np.asarray(en, dtype=np.int64)
            tracks = [self._span_track(x, a) for x, a in zip(ev, self.span_args)]
            lane_ids: dict = {}
            lane = np.asarray([lane_ids.setdefault(t, len(lane_ids)) for t in tracks], dtype=np.int64)
            store.add_spans(run_id, {
                "kind": _obj(kinds), "name": _obj([text(x.get("name")) if x.get("name") is not None else None
                                                   for x in ev]),
                "backend": _obj([t[0] for t in tracks]), "device": _obj([t[1] for t in tracks]),
                "thread": np.asarray([t[2] for t in tracks], dtype=np.int64),
                "depth": nesting_depth(lane, s, e), "step": _steps_at(step_spans, s), "start_ns": s, "end_ns": e,
                "args": _obj([text(a) if isinstance(a, dict) else None for a in self.span_args])},
                con=con)
        if self.memory:
            t, backend, live, alloc, free, rows = zip(*self.memory)
            # at the op around the allocation; one outside every op keeps the step its time falls in
            fallback = _steps_at(step_spans, np.asarray(t, dtype=np.int64)).tolist()
            mstep = [int(step[r]) if r is not None else s for r, s in zip(rows, fallback)]
            mseq = [int(seq[r]) if r is not None else None for r in rows]
            store.add_memory(run_id, list(zip(mstep, mseq, t, backend, live, alloc, free)), con=con)
        if self.flows:
            f = list(zip(*self.flows))
            fs, fq = at(f[6])
            ts, tq = at(f[11])
            store.add_flows(run_id, {
                "kind": _obj(f[0]), "flow_id": _obj(f[1]), "from_backend": _obj(f[2]), "from_device": _obj(f[3]),
                "from_thread": np.asarray(f[4], dtype=np.int64), "from_ns": np.asarray(f[5], dtype=np.int64),
                "from_step": fs, "from_seq": fq, "to_backend": _obj(f[7]), "to_device": _obj(f[8]),
                "to_thread": np.asarray(f[9], dtype=np.int64), "to_ns": np.asarray(f[10], dtype=np.int64),
                "to_step": ts, "to_seq": tq}, con=con)
        if self.kernel_rows:
            k = list(zip(*self.kernel_rows))
            ks, kq = at(k[0])
            store.add_kernel_args(run_id, {
                "step": ks, "seq": kq, "grid": _obj(k[1]), "block": _obj(k[2]), "registers": _masked_int(k[3]),
                "shared_memory": _masked_int(k[4]), "blocks_per_sm": _float_col(k[5]),
                "warps_per_sm": _float_col(k[6]), "occupancy": _float_col(k[7]), "correlation": _masked_int(k[8]),
                "args": _obj(k[9])}, con=con)

    def _span_track(self, ev: dict, args: dict):
        """A span goes on the track of the ops written with the same pid and tid; a GPU annotation on its stream."""
        k = (key(ev.get("pid", 0)), key(ev.get("tid", 0)))
        if k in self.lanes:
            return self.lanes[k]
        args = args if isinstance(args, dict) else {}
        if args.get("stream") is not None:
            stream = as_int(args.get("stream"))
            for t in self.tracks:
                if t["kind"] == "stream" and t["thread"] == stream:
                    return t["backend"], t["device"], t["thread"]
        return "torch:cpu", "cpu", as_int(k[1])


def _byte_counts(deltas: list, totals: list) -> tuple[list, list, list]:
    """[memory] events' Bytes (+ allocated, - freed) and Total Allocated -> (live, allocated, freed) per event,
    each read as `count` reads it; a column at a time where all are int64 integers (what torch writes)."""
    try:
        d = np.asarray(deltas, dtype=np.int64) if set(map(type, deltas)) <= {int} else None
    except OverflowError:
        d = None
    if d is None or (len(d) and d.min() == np.iinfo(np.int64).min):      # or one whose negation does not fit
        deltas = [v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0 for v in deltas]
        return list(map(count, totals)), [count(v) or 0 for v in deltas], [count(-v) or 0 for v in deltas]
    ok = set(map(type, totals)) <= {int} and in_range(totals)
    return (totals if ok else list(map(count, totals))), np.maximum(d, 0).tolist(), np.maximum(-d, 0).tolist()


def _steps_at(step_spans, t: np.ndarray) -> np.ndarray:
    if not step_spans:
        return np.zeros(len(t), dtype=np.int64)
    starts = np.asarray(sorted(s for s, _ in step_spans), dtype=np.int64)
    return np.maximum(np.searchsorted(starts, t, side="right") - 1, 0)


def _obj(values) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == object:
        return values
    arr = np.empty(len(values), dtype=object)
    arr[:] = list(values)
    return arr


def _float(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) else None


def _float_col(values) -> np.ma.MaskedArray:
    return np.ma.masked_array([0.0 if v is None else v for v in values], mask=[v is None for v in values],
                              dtype=np.float64)


def _masked_int(values) -> np.ma.MaskedArray:
    return np.ma.masked_array([0 if v is None else v for v in values], mask=[v is None for v in values],
                              dtype=np.int64)
