"""`--engine eager`: profile the model as written, no capture, by timing every ATen op.

A TorchDispatchMode sees each ATen call below autograd; forward pre/post hooks on the modules
say which module is running. Events have the same fields as the graph engine's: op is the
opscope op name when one maps the ATen overload (`aten:NAME` otherwise, `NAMESPACE:NAME` for a library's custom op), node is the overload
packet numbered by its occurrence in the step (`addmm`, `addmm_1`, ...), FLOPs come from
opscope's cost model on the call's shapes.

Speed: the per-call hot path only runs the op between two clock reads and appends one tuple
(overload, module, start, end, input/output (shape, dtype) pairs, source or None) to a list.
Everything else -- occurrence numbers, op names, JSON shapes, FLOPs, bytes -- is resolved when
the batch is flushed (end of step, or mid-step on a slow model), once per distinct site. The
source line needs the live stack, so it is looked up only at positions where the step differs
from the previous one (every position of the first step; none in a steady loop).
"""
from __future__ import annotations

import json
import operator
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opscope.runtime.graph import TensorMeta
from opscope.runtime.ops import OPS, flops_of, op_for_target
from opscope.runtime.capture import op_name
from opscope.runtime.ops.registry import bytes_of

from .batch import Batch
from .recorder import FLUSH_INTERVAL_NS
from .summaries import summarize

_SKIP_FILES = ("/torch/", "/opscope/profiler/", "/profiler/eager.py")
_Tensor = torch.Tensor
_SEQ = (list, tuple)
_ns = time.perf_counter_ns
_NEVER = 1 << 62
_KEY = operator.itemgetter(0, 1, 2, 3)    # a call: (overload, where, inputs, outputs, t0, t1, source)
_current_node = torch._C._current_autograd_node      # the autograd node running now: None outside backward
_sequence_nr = torch._C._autograd._get_sequence_nr  # the next autograd node's number
_T0 = operator.itemgetter(4)
_T1 = operator.itemgetter(5)


def _metas(values) -> list:
    """(shape, dtype) of each tensor among values, one list level deep (cat, stack, split outputs)."""
    out = []
    for v in values:
        if isinstance(v, _Tensor):
            out.append((v.shape, v.dtype))
        elif type(v) in _SEQ and v and type(v[0]) is not int:     # not a size list: tensors (or None)
            out.extend([(x.shape, x.dtype) for x in v if isinstance(x, _Tensor)])
    return out


def _dtype(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


class EagerProfiler(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # NOTE: True (torch's default) wraps __torch_dispatch__ in a dynamo-disable shim on every ATen
        # call (~3 us each, measured); the profiler runs eager models, so nothing here is compiled.
        return False

    def __init__(self, sink, *, backend: str = "torch:cpu", device: str = "cpu", values: bool = False):
        super().__init__()
        self.sink = sink
        self.backend = backend
        self.device = device
        self.values = values
        self.cuda = device.startswith("cuda")
        self.step = 0
        self.module = ""
        self.phase = "forward"                 # 'optimizer' while an optimizer steps (script.py sets it)
        # where a call runs, one tuple the hot path appends as is: (module, phase, forward position or None)
        self.where = ("", "forward", None)
        self._fwd_pos: dict = {}               # autograd sequence number -> position of the forward call
        self._modules: list[str] = []
        self._sites: dict = {}
        self._node_of: list[str] = []          # site -> node name
        self._new_sites: list = []
        self._funcs: dict = {}                 # overload -> (opscope op, packet name)
        self._counts: dict | None = None       # packet name -> occurrences so far in this step
        self._calls: list = []                 # this step's raw calls (the hot path appends here)
        self._sent = 0                         # calls already turned into events this step
        self._keys: list = []                  # this step's (overload, module, inputs, outputs) per position
        self._step_sites: list = []            # this step's site ids, one array per flush
        self._srcs: list = []                  # this step's source per position
        self._prev: list = []                  # the same three for the previous step
        self._prev_sites = np.zeros(0, np.int64)
        self._prev_srcs: list = []
        self._tensors: list = []
        self._thread = threading.get_native_id()
        self._deadline = _NEVER
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
            self.enter_module(name)
        return pre

    def _leave(self, mod, args, out):
        self.leave_module()

    def enter_module(self, name: str) -> None:
        self._modules.append(name)
        self.module = name
        self.where = (name, self.phase, None)

    def leave_module(self) -> None:
        if self._modules:
            self._modules.pop()
        self.module = self._modules[-1] if self._modules else ""
        self.where = (self.module, self.phase, None)

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self.where = (self.module, phase, None)

    # --- one step ------------------------------------------------------------------------
    def run_step(self, fn):
        self.begin_step()
        try:
            with self:
                return fn()
        finally:
            self.end_step()

    def begin_step(self) -> None:
        """From here, calls belong to step `self.step` (run_step, or script.py between optimizer steps)."""
        self._calls, self._sent, self._counts = [], 0, None
        self._fwd_pos = {}
        self._keys, self._step_sites, self._srcs = [], [], []
        self._thread = threading.get_native_id()
        if self.cuda:
            self._deadline = _NEVER          # device times resolve only after the step's sync
            self._anchor = torch.cuda.Event(enable_timing=True)
            self._anchor.record()
            self._anchor_ns = _ns()
        else:
            self._deadline = _ns() + FLUSH_INTERVAL_NS

    def end_step(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self._resolve_cuda()
        self.flush()
        self._prev, self._prev_srcs = self._keys, self._srcs
        self._prev_sites = np.concatenate(self._step_sites) if self._step_sites else np.zeros(0, np.int64)
        self._calls = []
        self.step += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # the hot path: clock reads, shape and dtype references, one append; resolved in flush()
        if self.cuda:
            return self._dispatch_cuda(func, args, kwargs)
        # what OpOverload.__call__ does, minus a frame (the attribute is newer than torch 2.13)
        call = func._op if getattr(func, "_pyobj_dispatcher", 1) is None else func
        calls = self._calls
        i = len(calls)
        node = _current_node()
        if node is None:
            where = self.where
            self._fwd_pos.setdefault(_sequence_nr(), i)     # the first call after its autograd node was made
        else:                       # autograd's engine runs this op: the backward of the node's forward call
            where = ("", "backward", self._fwd_pos.get(node._sequence_nr() + 1))
        t0 = _ns()
        out = call(*args, **kwargs) if kwargs else call(*args)
        t1 = _ns()
        prev = self._prev
        calls.append((func, where, _metas(args),
                      [(out.shape, out.dtype)] if isinstance(out, _Tensor) else
                      _metas(out) if type(out) in _SEQ else [],
                      t0, t1, None if i < len(prev) and prev[i][0] is func else _user_source()))
        if self.values:
            self._summaries(i, out)
        if t1 > self._deadline:       # a slow model's live view still sees events every 100 ms
            self.flush()
        return out

    def _dispatch_cuda(self, func, args, kwargs):
        calls = self._calls
        i = len(calls)
        where = self._where(i)
        ev0 = torch.cuda.Event(enable_timing=True)
        ev0.record()
        out = func(*args, **(kwargs or {}))
        ev1 = torch.cuda.Event(enable_timing=True)
        ev1.record()
        prev = self._prev
        outs = [(out.shape, out.dtype)] if isinstance(out, _Tensor) else _metas(out) if type(out) in _SEQ else []
        calls.append((func, where, _metas(args), outs, ev0, ev1,
                      None if i < len(prev) and prev[i][0] is func else _user_source()))
        if self.values:
            self._summaries(i, out)
        return out

    def _where(self, i):
        """The hot path's where (inlined there): phase, module, and for a backward call its forward call."""
        node = _current_node()
        if node is None:
            self._fwd_pos.setdefault(_sequence_nr(), i)
            return self.where
        return ("", "backward", self._fwd_pos.get(node._sequence_nr() + 1))

    def _resolve_cuda(self) -> None:
        a, a_ns = self._anchor, self._anchor_ns
        self._calls = [(f, m, i, o, a_ns + int(a.elapsed_time(e0) * 1e6), a_ns + int(a.elapsed_time(e1) * 1e6), s)
                       for f, m, i, o, e0, e1, s in self._calls]

    # --- after the hot path: sites and events --------------------------------------------
    def _resolve(self) -> np.ndarray | None:
        """The calls since the last flush as event rows (site, seq, start, end, live)."""
        start, end = self._sent, len(self._calls)
        if start >= end:
            return None
        seg = self._calls[start:end]
        keys = list(map(_KEY, seg))
        if self._counts is None and keys == self._prev[start:end]:
            # the steady state: the same calls, shapes and modules as the previous step, in C loops
            sites = self._prev_sites[start:end]
            self._srcs += self._prev_srcs[start:end]
        else:
            sites = self._resolve_sites(seg, start)
        self._keys += keys
        self._step_sites.append(sites)
        self._sent = end
        ev = np.zeros((end - start, 5), np.int64)
        ev[:, 0] = sites
        ev[:, 1] = np.arange(start, end)
        ev[:, 2] = np.fromiter(map(_T0, seg), np.int64, end - start)
        ev[:, 3] = np.fromiter(map(_T1, seg), np.int64, end - start)
        return ev

    def _resolve_sites(self, seg, start) -> np.ndarray:
        """Site per call, making new sites (cached by call, shapes, module, occurrence, source)."""
        funcs, srcs, prev_srcs = self._funcs, self._srcs, self._prev_srcs
        if self._counts is None:           # steady segments before this one did not count occurrences;
            # from here on the step counts them (a later segment's occurrence numbers may have shifted)
            self._counts = {}
            for key in self._keys:
                name = self._info(key[0])[1]
                self._counts[name] = self._counts.get(name, 0) + 1
        counts, sites = self._counts, self._sites
        out = np.empty(len(seg), np.int64)
        for j, (func, where, ins, outs, _, _, src) in enumerate(seg):
            if src is None:
                src = prev_srcs[start + j]
            srcs.append(src)
            info = funcs.get(func) or self._info(func)
            k = counts.get(info[1], 0)
            counts[info[1]] = k + 1
            key = (func, where, tuple(ins), tuple(outs), k, src)
            site = sites.get(key)
            if site is None:
                module, phase, pos = where
                fwd = ""
                if pos is not None:              # a backward call: its forward call's module and node name
                    module = self._calls[pos][1][0]
                    fwd = self._node_of[out[pos - start] if pos >= start else self._site_at(pos)]
                site = self._new_site(key, info, module, ins, outs, k, src, phase, fwd)
            out[j] = site
        return out

    def _site_at(self, pos: int) -> int:
        """The site of an earlier call of this step (already resolved)."""
        for arr in self._step_sites:
            if pos < len(arr):
                return int(arr[pos])
            pos -= len(arr)
        raise IndexError(pos)

    def _info(self, func) -> tuple[str, str]:
        info = self._funcs.get(func)
        if info is None:
            info = self._funcs[func] = op_info(func)
        return info

    def _new_site(self, key, info, module, ins, outs, k, src, phase="forward", fwd="") -> int:
        site = len(self._sites)
        self._sites[key] = site
        op, name = info
        self._node_of.append(name if k == 0 else f"{name}_{k}")
        self._new_sites.append(site_row(site, op, self._node_of[site], module, src, self.backend, self.device,
                                        [(tuple(s), _dtype(d)) for s, d in ins],
                                        [(tuple(s), _dtype(d)) for s, d in outs], phase, fwd))
        return site

    # --- the interface script.py drives (the native engine has the same) -------------------
    def step_ops(self) -> int:
        """Ops recorded in the current step so far."""
        return len(self._calls)

    def leave_in_child(self) -> None:
        """In a forked child (a DataLoader worker): stop recording there."""
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode
        try:
            while any(m is self for m in _get_current_dispatch_mode_stack()):
                _pop_mode()
        except Exception:    # torch internals moved: the child then records into a sink nobody reads
            pass

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
        ev = self._resolve()
        if ev is None and not self._tensors and not self._new_sites:
            return
        batch = Batch(self.step, self._thread, self._new_sites, ev, self._tensors)
        self._tensors = []
        if self.sink.send(batch):
            self._new_sites = []       # sites go again with the next batch until one gets through
        if not self.cuda:
            self._deadline = _ns() + FLUSH_INTERVAL_NS


def op_info(func) -> tuple[str, str]:
    """(opscope op name, overload packet name) of an ATen OpOverload: `aten:NAME` when no opscope op maps it."""
    return op_for_target(func) or op_name(func), func.overloadpacket.__name__


def site_row(site: int, op: str, node: str, module: str, src: str, backend: str, device: str, ins: list, outs: list,
             phase: str = "forward", fwd: str = "") -> tuple:
    """A site in batch.SITE_COLUMNS order from (shape, dtype name) pairs; FLOPs and bytes from opscope's
    cost model on those shapes (both engines, eager and native, make their sites here)."""
    in_meta = [TensorMeta(tuple(s), d) if s is not None else None for s, d in ins]
    out_meta = [TensorMeta(tuple(s), d) if s is not None else None for s, d in outs]
    node_ns = SimpleNamespace(op=op, input_meta=[m for m in in_meta if m is not None],
                              output_meta=[m for m in out_meta if m is not None], attrs={}, args=(), kwargs={})
    try:
        flops = int(flops_of(node_ns)) if op in OPS else 0
    except Exception:        # a cost model that needs more than shapes: no FLOPs, not no event
        flops = 0
    try:
        nbytes = int(bytes_of(node_ns))
    except Exception:
        nbytes = 0
    sep = (",", ":")
    return (site, op, node, module, src, backend, device, 0,
            json.dumps([list(m.shape) if m else None for m in in_meta], separators=sep),
            json.dumps([m.dtype if m else None for m in in_meta], separators=sep),
            json.dumps([list(m.shape) if m else None for m in out_meta], separators=sep),
            json.dumps([m.dtype if m else None for m in out_meta], separators=sep),
            nbytes, flops, False, 0, 0, phase, fwd)


def _user_source() -> str:
    """file.py:line of the innermost frame outside torch and the profiler."""
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
