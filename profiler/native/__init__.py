"""The native script engine: a C++ RecordFunction observer (observer.cpp) instead of a Python dispatch mode.

    engine, note = native_engine(sink, backend="torch:cpu", device="cpu")   # None and why, if it cannot build
    engine.begin_step(); engine.__enter__()            # script.py drives it exactly like the eager engine
    engine.enter_module("0"); ...; engine.end_step()   # events go to the sink as batches, one per step

It records what the eager engine records -- every ATen op a dispatch mode would see, its module
path, phase and, for a backward op, the forward op it differentiates -- with no Python on the op's
path: the observer interns sites and appends integer rows in C++, and Python turns new sites into
site rows (names, JSON shapes, FLOPs, bytes) when it drains the buffer, at the end of each step or
every 100 ms from a module hook on a slow step. What it does not record: the op's source line (that
needs the Python stack) and tensor values (`--values` keeps the eager engine).
"""
from __future__ import annotations

import time

import numpy as np

from ..batch import Batch
from ..recorder import FLUSH_INTERVAL_NS

PHASES = {"forward": 0, "backward": 1, "optimizer": 2}
_PHASE_NAMES = {v: k for k, v in PHASES.items()}
_ns = time.perf_counter_ns


def native_engine(sink, *, backend: str = "torch:cpu", device: str = "cpu", quiet: bool = True):
    """(NativeEngine, None), or (None, one line saying why it is not available here)."""
    if device.startswith("cuda"):
        return None, "the native engine times CPU ops; CUDA scripts use the eager engine (device times)"
    from .build import load
    mod, note = load(quiet=quiet)
    if mod is None:
        return None, note
    return NativeEngine(sink, mod, backend=backend, device=device), None


class NativeEngine:
    def __init__(self, sink, mod, *, backend: str = "torch:cpu", device: str = "cpu"):
        self.sink = sink
        self.backend = backend
        self.device = device
        self.step = 0
        self.module = ""
        self._modules: list[str] = []
        self._mod = mod
        mod.reset()                        # the extension's state outlives an engine (one per process)
        self._module_ids = {"": 0}
        self._module_names = [""]
        self._names: dict = {}             # name id -> (opscope op, packet name)
        self._sigs: dict = {}              # signature id -> (name id, inputs, outputs)
        self._node_of: dict = {}           # site -> node name
        self._new_sites: list = []
        self._dtypes = _dtype_names(mod)
        self._deadline = _ns() + FLUSH_INTERVAL_NS
        self._on = False

    # --- what script.py calls (the eager engine's interface) -------------------------------
    def enter_module(self, name: str) -> None:
        self._modules.append(name)
        self.module = name
        self._mod.set_module(self._module_id(name))
        if _ns() > self._deadline:     # a slow step: the live view still sees events every 100 ms
            self.flush()

    def leave_module(self) -> None:
        if self._modules:
            self._modules.pop()
        self.module = self._modules[-1] if self._modules else ""
        self._mod.set_module(self._module_id(self.module))

    def set_phase(self, phase: str) -> None:
        self._mod.set_phase(PHASES[phase])

    def begin_step(self) -> None:
        self._deadline = _ns() + FLUSH_INTERVAL_NS

    def end_step(self) -> None:
        self.flush()
        self._mod.end_step()
        self.step += 1

    def step_ops(self) -> int:
        return int(self._mod.step_ops())

    def __enter__(self):
        self._mod.start()
        self._on = True
        return self

    def __exit__(self, *exc) -> None:
        if self._on:
            self._mod.stop()
            self._on = False

    def leave_in_child(self) -> None:
        self.__exit__()

    # --- draining --------------------------------------------------------------------------
    def _module_id(self, name: str) -> int:
        mid = self._module_ids.get(name)
        if mid is None:
            mid = self._module_ids[name] = len(self._module_names)
            self._module_names.append(name)
        return mid

    def flush(self) -> None:
        raw, names, sigs, sites = self._mod.drain()
        for i, name, overload in names:
            self._names[i] = _op_of(name, overload)
        for row in sigs:
            self._sigs[row[0]] = self._signature(row[1:])
        for row in sites:
            self._new_sites.append(self._site(*row))
        self._deadline = _ns() + FLUSH_INTERVAL_NS
        rows = np.frombuffer(raw, np.int64).reshape(-1, 5)
        if not len(rows):
            if self._new_sites:
                self._send(Batch(self.step, 0, self._new_sites, None, []))
            return
        threads = np.unique(rows[:, 4])
        for tid in threads:        # a batch has one thread: ops from other threads (autograd's) go apart
            part = rows[rows[:, 4] == tid] if len(threads) > 1 else rows
            ev = np.zeros((len(part), 5), np.int64)
            ev[:, :4] = part[:, :4]
            self._send(Batch(self.step, int(tid), self._new_sites, ev, []))

    def _send(self, batch: Batch) -> None:
        if self.sink.send(batch):
            self._new_sites = []       # sites go again with the next batch until one gets through

    def _signature(self, key: list) -> tuple:
        name, i = key[0], 1
        sides = []
        for _ in range(2):             # inputs, then outputs: a count of ints, then (ndim, dims..., dtype) each
            n, i = key[i], i + 1
            end, metas = i + n, []
            while i < end:
                nd = key[i]
                shape = None if nd < 0 else tuple(key[i + 1:i + 1 + nd])
                i += 1 + max(nd, 0)
                metas.append((shape, self._dtypes.get(key[i], str(key[i]))))
                i += 1
            sides.append(metas)
        return name, sides[0], sides[1]

    def _site(self, site, sig, module, phase, k, fwd_site) -> tuple:
        from ..eager import site_row
        name_id, ins, outs = self._sigs[sig]
        op, packet = self._names[name_id]
        node = packet if k == 0 else f"{packet}_{k}"
        self._node_of[site] = node
        return site_row(site, op, node, self._module_names[module] if module >= 0 else "", "", self.backend,
                        self.device, ins, outs, _PHASE_NAMES[phase], self._node_of.get(fwd_site, "") if fwd_site >= 0
                        else "")


def _op_of(name: str, overload: str) -> tuple[str, str]:
    """`aten::addmm` + overload -> (opscope op, packet name), as the eager engine names the OpOverload."""
    import torch
    from ..eager import op_info
    ns, _, packet = name.partition("::")
    try:
        func = getattr(getattr(getattr(torch.ops, ns), packet), overload or "default")
    except (AttributeError, RuntimeError):
        return f"{ns}:{packet}", packet
    return op_info(func)


def _dtype_names(mod) -> dict:
    """ScalarType number -> the dtype name events use (`float32`), asked of the extension once."""
    import warnings

    import torch
    names = {}
    with warnings.catch_warnings():            # experimental dtypes warn (into the script's output)
        warnings.simplefilter("ignore")
        for d in {v for v in vars(torch).values() if isinstance(v, torch.dtype)}:
            try:
                names[int(mod.scalar_type(torch.empty(0, dtype=d)))] = str(d).removeprefix("torch.")
            except Exception:      # dtypes with no plain tensors (bits)
                continue
    return names
