"""`--engine eager`: profile the model as written, no capture, by timing every ATen op.

A TorchDispatchMode sees each ATen call below autograd; forward pre/post hooks on the modules
say which module is running. Events have the same fields as the graph engine's: op is the
opscope op name when one maps the ATen overload (`aten:NAME` otherwise), node is the overload
packet numbered by its occurrence in the step (`addmm`, `addmm_1`, ...), FLOPs come from
opscope's cost model on the call's shapes.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opscope.runtime.graph import TensorMeta
from opscope.runtime.ops import OPS, flops_of, op_for_target
from opscope.runtime.ops.registry import bytes_of

from .batch import Batch
from .recorder import FLUSH_EVENTS, FLUSH_INTERVAL_NS
from .summaries import summarize

_SKIP_FILES = ("/torch/", "/opscope/profiler/", "/profiler/eager.py")


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _tensors(values):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, torch.Tensor):
                    yield x


class EagerProfiler(TorchDispatchMode):
    def __init__(self, sink, *, backend: str = "torch:cpu", device: str = "cpu", values: bool = False):
        super().__init__()
        self.sink = sink
        self.backend = backend
        self.device = device
        self.values = values
        self.cuda = device.startswith("cuda")
        self.step = 0
        self.module = ""
        self._modules: list[str] = []
        self._sites: dict = {}
        self._new_sites: list = []
        self._counts: dict = {}
        self._buf: list = []
        self._tensors: list = []
        self._seq = 0
        self._thread = threading.get_native_id()
        self._last_flush = 0
        self._handles = []

    # --- modules -------------------------------------------------------------------------
    def watch(self, model: torch.nn.Module) -> "EagerProfiler":
        for name, mod in model.named_modules():
            self._handles.append(mod.register_forward_pre_hook(self._enter(name)))
            self._handles.append(mod.register_forward_hook(self._leave))
        return self

    def unwatch(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _enter(self, name):
        def pre(mod, args):
            self._modules.append(name)
            self.module = name
        return pre

    def _leave(self, mod, args, out):
        if self._modules:
            self._modules.pop()
        self.module = self._modules[-1] if self._modules else ""

    # --- one step ------------------------------------------------------------------------
    def run_step(self, fn):
        self._seq = 0
        self._counts = {}
        self._thread = threading.get_native_id()
        self._last_flush = time.perf_counter_ns()
        if self.cuda:
            self._anchor = torch.cuda.Event(enable_timing=True)
            self._anchor.record()
            self._anchor_ns = time.perf_counter_ns()
        try:
            with self:
                return fn()
        finally:
            if self.cuda:
                torch.cuda.synchronize()
                self._resolve()
            self.flush()
            self.step += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.cuda:
            ev0 = torch.cuda.Event(enable_timing=True)
            ev0.record()
            out = func(*args, **kwargs)
            ev1 = torch.cuda.Event(enable_timing=True)
            ev1.record()
            t0, t1 = ev0, ev1
        else:
            t0 = time.perf_counter_ns()
            out = func(*args, **kwargs)
            t1 = time.perf_counter_ns()
        ins = tuple((tuple(t.shape), t.dtype) for t in _tensors(args))
        packet = func.overloadpacket
        k = self._counts.get(packet, 0)
        self._counts[packet] = k + 1
        key = (func, self.module, ins, k)
        site = self._sites.get(key)
        if site is None:
            site = self._new_site(key, func, ins, out, k)
        seq = self._seq
        self._seq = seq + 1
        self._buf.append((site, seq, t0, t1, 0))
        if self.values:
            self._summaries(seq, out)
        if not self.cuda and (len(self._buf) >= FLUSH_EVENTS or t1 - self._last_flush > FLUSH_INTERVAL_NS):
            self.flush()
        return out

    def _new_site(self, key, func, ins, out, k) -> int:
        site = len(self._sites)
        self._sites[key] = site
        op = op_for_target(func) or f"aten:{func.overloadpacket.__name__}"
        outs = [o for o in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(o, torch.Tensor)]
        in_meta = [TensorMeta(s, str(d).removeprefix("torch.")) for s, d in ins]
        out_meta = [TensorMeta(tuple(o.shape), _dtype(o)) for o in outs]
        node = SimpleNamespace(op=op, input_meta=in_meta, output_meta=out_meta, attrs={}, args=(), kwargs={})
        try:
            flops = int(flops_of(node)) if op in OPS else 0
        except Exception:        # a cost model that needs more than shapes: no FLOPs, not no event
            flops = 0
        try:
            nbytes = int(bytes_of(node))
        except Exception:
            nbytes = 0
        name = func.overloadpacket.__name__
        sep = (",", ":")
        self._new_sites.append((
            site, op, name if k == 0 else f"{name}_{k}", self.module, _user_source(), self.backend, self.device, 0,
            json.dumps([list(m.shape) for m in in_meta], separators=sep),
            json.dumps([m.dtype for m in in_meta], separators=sep),
            json.dumps([list(m.shape) for m in out_meta], separators=sep),
            json.dumps([m.dtype for m in out_meta], separators=sep),
            nbytes, flops, False, 0, 0))
        return site

    def _resolve(self) -> None:
        a, a_ns = self._anchor, self._anchor_ns
        self._buf = [(s, q, a_ns + int(a.elapsed_time(e0) * 1e6), a_ns + int(a.elapsed_time(e1) * 1e6), 0)
                     for s, q, e0, e1, _ in self._buf]

    def _summaries(self, seq, out) -> None:
        outs = out if isinstance(out, (list, tuple)) else [out]
        for i, o in enumerate(outs):
            if not isinstance(o, torch.Tensor) or o.is_complex():
                continue
            with torch._C._DisableTorchDispatch():   # reading values must not record more ops
                t = o.detach()
                t = t.float() if t.dtype in (torch.bfloat16, torch.float16) else t
                row = summarize(t.cpu().numpy())
            if row is not None:
                self._tensors.append((self.step, seq, f"out{i}", *row))

    def flush(self) -> None:
        buf, self._buf = self._buf, []
        if not buf and not self._tensors and not self._new_sites:
            return
        ev = np.array(buf, dtype=np.int64).reshape(-1, 5) if buf else None
        batch = Batch(self.step, self._thread, self._new_sites, ev, self._tensors)
        self._tensors = []
        if self.sink.send(batch):
            self._new_sites = []
        self._last_flush = time.perf_counter_ns()


def _user_source() -> str:
    """file.py:line of the innermost frame outside torch and the profiler (once per site)."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not any(s in name for s in _SKIP_FILES) and not name.startswith("<"):
            return f"{name.rsplit('/', 1)[-1]}:{f.f_lineno}"
        f = f.f_back
    return ""


def run_eager(model, inputs, sink, *, steps: int, warmup: int, values: bool, backend: str, device: str) -> int:
    """Warm-up steps unrecorded, then `steps` recorded ones; returns events recorded."""
    model = model.to(device)
    inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
    with torch.no_grad():
        for _ in range(warmup):
            model(*inputs)
        prof = EagerProfiler(sink, backend=backend, device=device, values=values).watch(model)
        try:
            for _ in range(steps):
                prof.run_step(lambda: model(*inputs))
        finally:
            prof.unwatch()
    return prof.step
