"""Inside one rank of a torchrun job that `opscope profile -- torchrun ...` started (see torchrun.py).

    # the sitecustomize torchrun.py puts first on PYTHONPATH runs, in every Python process of the job:
    from opscope.profiler.rank_profile import start_rank
    start_rank()          # a no-op unless RANK, WORLD_SIZE and OPSCOPE_RANKS_DIR are set (a rank, not the launcher)

The rank runs the same engine as `opscope profile -- python script.py` (script.py: module paths, phases,
steps at optimizer.step()), collecting its batches in memory. Collectives are recorded beside the ATen ops:
torch.distributed's Python calls (all_reduce, broadcast, all_gather, ...) as spans from the call to the
end of the work, and DDP's bucketed all-reduce through a communication hook that times each bucket from
issue to completion (the reducer issues them from C++, out of any Python call's sight). Each span's
bytes are the tensor's. At exit the rank writes its steps into the job's shared folder (shared.py's
layout: rank 0 also writes run.json), which the profile command imports as one run.

Clocks: every span is on time.perf_counter_ns (CLOCK_MONOTONIC), one clock for all ranks of one host.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time

ENV_DIR = "OPSCOPE_RANKS_DIR"         # the job's shared folder (torchrun.py makes it)
ENV_ENGINE = "OPSCOPE_RANKS_ENGINE"   # native | eager
ENV_COMMAND = "OPSCOPE_RANKS_COMMAND"  # what the user typed, for the run's name
_COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                "reduce_scatter_tensor", "all_to_all_single", "reduce", "gather", "scatter", "barrier",
                "send", "recv")
_rank: "RankProfile | None" = None


class _Collect:
    """The engine's sink: batches kept in memory until the rank exits."""

    def __init__(self):
        self.sites: dict[int, tuple] = {}
        self.events: list = []            # (step, thread, int64 array (n, 5))

    def send(self, batch) -> bool:
        from .batch import full_site
        for s in batch.sites:
            self.sites[s[0]] = full_site(s)
        if batch.n:
            self.events.append((batch.step, batch.thread, batch.events.copy()))
        return True


def sent_bytes(shapes: str, dtypes: str) -> int:
    """The bytes a c10d op sends: its inputs. The engine counts inputs and outputs, and an in-place collective
    (allreduce_, broadcast_) returns its input, so that counted every byte twice."""
    import json

    import torch
    try:
        shapes, dtypes = json.loads(shapes or "[]"), json.loads(dtypes or "[]")
    except ValueError:
        return 0
    total = 0
    for shape, dtype in zip(shapes, dtypes):
        n = 1
        for d in shape if isinstance(shape, list) else []:
            n *= int(d) if isinstance(d, int) else 1
        item = getattr(torch, str(dtype), None)
        total += n * (item.itemsize if isinstance(item, torch.dtype) else 0)
    return total


def _nbytes(value) -> int:
    import torch
    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


class RankProfile:
    def __init__(self, folder: str, rank: int, world: int, engine: str):
        from .script import ScriptProfile
        self.folder, self.rank, self.world = folder, rank, world
        self.sink = _Collect()
        self.profile = ScriptProfile(self.sink, engine=engine)
        self.comms: list[tuple] = []      # (step, op, start_ns, end_ns, bytes, source)
        self.error: str | None = None
        self._patched: list = []
        self._local = threading.local()

    @property
    def step(self) -> int:
        return self.profile.marks

    def record(self, op: str, start: int, end: int, nbytes: int, source: str = "") -> None:
        self.comms.append((self.step, op, start, end, nbytes, source))

    # --- collectives -----------------------------------------------------------------------
    def _wrap(self, module, name: str) -> None:
        real = getattr(module, name, None)
        if real is None or getattr(real, "_opscope_real", None) is not None:
            return
        prof = self

        def timed(*args, **kwargs):
            if getattr(prof._local, "quiet", False):     # inside a DDP bucket's hook: that span is the bucket's
                return real(*args, **kwargs)
            start = time.perf_counter_ns()
            work = real(*args, **kwargs)
            nbytes = _nbytes(args[0]) if args else _nbytes(next(iter(kwargs.values()), None))
            step = prof.step
            if work is not None and hasattr(work, "get_future") and kwargs.get("async_op"):
                try:                      # async: the span ends when the work completes, not when the call returns
                    work.get_future().then(lambda f: prof.comms.append(
                        (step, name, start, time.perf_counter_ns(), nbytes, "torch.distributed")))
                    return work
                except Exception:         # a work without a future (some backends): the call's span only
                    pass
            prof.comms.append((step, name, start, time.perf_counter_ns(), nbytes, "torch.distributed"))
            return work

        timed._opscope_real = real
        timed.__name__ = name
        setattr(module, name, timed)
        self._patched.append((module, name, real))

    def _hook_ddp(self) -> None:
        """DDP's reducer all-reduces its buckets from C++: a communication hook (the default all-reduce,
        averaged as DDP's own is) times each one. A script's own hook is wrapped the same way instead."""
        from torch.nn.parallel import DistributedDataParallel as DDP
        if getattr(DDP, "_opscope_hooked", False):
            return
        prof = self
        real_register, real_forward = DDP.register_comm_hook, DDP.forward

        def timing(hook):
            def timed(state, bucket):
                start, nbytes, step = time.perf_counter_ns(), _nbytes(bucket.buffer()), prof.step
                prof._local.quiet = True
                try:
                    fut = hook(state, bucket)
                finally:
                    prof._local.quiet = False

                def done(f):
                    prof.comms.append((step, "all_reduce", start, time.perf_counter_ns(), nbytes, "ddp bucket"))
                    return f.value()
                return fut.then(done)
            return timed

        def register_comm_hook(self, state, hook):
            self._opscope_comm_hook = True
            return real_register(self, state, timing(hook))

        def forward(self, *args, **kwargs):
            if not getattr(self, "_opscope_comm_hook", False):
                from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
                register_comm_hook(self, getattr(self, "process_group", None), allreduce_hook)
            return real_forward(self, *args, **kwargs)

        DDP.register_comm_hook, DDP.forward, DDP._opscope_hooked = register_comm_hook, forward, True

    # --- start / end --------------------------------------------------------------------------
    def start(self) -> "RankProfile":
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        for name in _COLLECTIVES:
            self._wrap(dist, name)
            if getattr(c10d, name, None) is not getattr(dist, name, None):
                self._wrap(c10d, name)
        self._hook_ddp()
        self.profile.start()
        hook = sys.excepthook

        def excepthook(kind, exc, tb):
            self.error = f"{kind.__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
            hook(kind, exc, tb)
        sys.excepthook = excepthook
        atexit.register(self.finish)
        return self

    def finish(self) -> None:
        """At exit: stop the engine and write this rank's steps (rank 0: the job's run.json too)."""
        from .shared import RankWriter
        info = self.profile.stop()
        folder, job = os.path.split(self.folder.rstrip("/"))
        writer = RankWriter(folder, job, self.rank)
        run = None
        if self.rank == 0:
            run = {"model": os.environ.get(ENV_COMMAND) or "torchrun job", "backend": "torch:cpu",
                   "world_size": self.world, "steps": max(1, info["steps"]),
                   "engine": self.profile.engine_name, "hybrid": "",
                   "clock": "wall: each rank's monotonic clock (one clock for the ranks of one host)"}
        writer.begin(run, {"backend": "torch:cpu", "engine": self.profile.engine_name,
                           "local_rank": os.environ.get("LOCAL_RANK")})
        for step, cols in sorted(self.columns().items()):
            writer.step(step, cols)
        writer.end("failed" if self.error else "ok", self.error,
                   report={"script": info, "collectives": len(self.comms)} if self.rank == 0 else None)

    def columns(self) -> dict[int, dict]:
        """This rank's events per step as event columns (EVENT_COLUMNS without run_id)."""
        import numpy as np

        from .batch import SITE_COLUMNS
        from .schema import EVENT_COLUMNS
        per: dict[int, list] = {}
        idx = {c: i for i, c in enumerate(SITE_COLUMNS)}
        # steps as the script has them: what runs after the last optimizer.step() (the loop's logging
        # all-reduce, destroy_process_group) belongs to the last step, not to one more
        last = self.step - 1 if self.step > 0 else None
        tail: list = []

        def step_of(step: int) -> int:
            return last if last is not None and step > last else step
        for step, thread, ev in self.sink.events:
            for site, seq, s, e, live in ev.tolist():
                row = self.sink.sites.get(site)
                if row is None:
                    continue
                r = {**{c: row[i] for c, i in idx.items() if c in EVENT_COLUMNS and c != "step"},
                     "seq": seq, "start_ns": s, "end_ns": e, "live_bytes": live, "thread": thread}
                if str(r.get("op", "")).startswith("c10d:"):
                    r["bytes"] = sent_bytes(r.get("input_shapes"), r.get("input_dtypes"))
                (tail if step_of(step) != step else per.setdefault(step, [])).append(r)
        if tail:                          # numbered after the last step's own ops: (step, seq) stays a key
            rows = per.setdefault(last, [])
            base = max((r["seq"] for r in rows), default=-1) + 1
            rows.extend({**r, "seq": base + r["seq"]} for r in tail)
        for i, (step, op, s, e, nbytes, source) in enumerate(sorted(self.comms, key=lambda c: c[2])):
            rows = per.setdefault(step_of(step), [])
            seq = max((r["seq"] for r in rows), default=-1) + 1
            rows.append({"op": op, "node": f"{op}_{i}", "module": "", "source": source, "backend": "torch:cpu",
                         "device": "cpu", "depth": 0, "input_shapes": "[]", "input_dtypes": "[]",
                         "output_shapes": "[]", "output_dtypes": "[]", "bytes": nbytes, "flops": 0,
                         "fallback": False, "phase": "communication", "fwd_node": "", "parent": "", "clock": "", "seq": seq, "start_ns": s,
                         "end_ns": e, "live_bytes": 0, "thread": 1})
        out = {}
        for step, rows in per.items():
            cols = {c: [r.get(c) for r in rows] for c in EVENT_COLUMNS[1:] if c not in ("step", "rank", "world_size")}
            n = len(rows)
            cols.update(step=np.full(n, step, np.int64), rank=np.full(n, self.rank, np.int64),
                        world_size=np.full(n, self.world, np.int64))
            out[step] = cols
        return out


def start_rank() -> RankProfile | None:
    """Profile this process when it is a rank of the job (RANK, WORLD_SIZE and the job folder are set)."""
    global _rank
    folder = os.environ.get(ENV_DIR)
    if _rank is not None or not folder or "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError:
        return None
    _rank = RankProfile(folder, rank, world, os.environ.get(ENV_ENGINE) or "eager").start()
    return _rank
