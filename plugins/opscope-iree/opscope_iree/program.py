"""One region as an IREE program: to_torch(region) -> MLIR (iree-turbine's AOT export, weights folded in as
literals) -> a .vmfb for the target -> called through IREE's runtime with numpy in and out.

Per-op spans: IREE fuses members into dispatches, and its own per-dispatch profiler is Tracy (a separate
capture tool); the MLIR the exporter writes carries file:line locations, not the members' n<i> scopes, so
dispatches cannot be named by member. A profiled step therefore times the IREE call itself, and after the
step (outside the timed call) runs the region's torch form once more on the same inputs with a hook per
member; those per-member times are laid end to end and scaled to fit the IREE call, and the clock says so.
"""
from __future__ import annotations

import io
import re
import time
import warnings
from importlib import metadata

import numpy as np
from opscope.runtime.plugin import RegionProgram, StackFailed, example_inputs, to_torch

CLOCK = ("iree call on the host clock, split by torch-eager per-member times (hooks on n<i>), scaled to fit "
         "the IREE call: IREE fuses members into dispatches and names none by member")
_DEVICES: dict = {}


def version() -> str:
    return f"iree {metadata.version('iree-base-compiler')}"


def compile_region(region, opts) -> IreeProgram:
    try:
        return IreeProgram(region, opts, _compile(region, opts))
    except Exception as e:        # the exporter and IREE's compiler raise anything on a graph they cannot take
        raise StackFailed("iree", region, e, _why(e)) from e


def load_region(region, blob: bytes, opts) -> IreeProgram:
    """A plan's saved .vmfb for the region (a FlatBuffer IREE's runtime verifies as it loads it)."""
    return IreeProgram(region, opts, blob)


def _compile(region, opts) -> bytes:
    import iree.compiler as ic
    import iree.turbine.aot as aot
    import torch
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")      # the exporter's FutureWarnings, once per region
        # non-strict: strict export runs dynamo over every member, minutes on a training region
        exported = aot.export(to_torch(region), *example_inputs(region), strict_export=False)
    code = io.BytesIO()                      # bytecode: the weights' text form would be hex, twice the size
    exported.mlir_module.operation.write_bytecode(code)
    extra = ["--iree-llvmcpu-target-cpu=host"] if opts["target"] == "llvm-cpu" else []
    return ic.compile_str(code.getvalue(), target_backends=[opts["target"]], extra_args=extra)


def _why(e: BaseException) -> str:
    """IREE's one error line (its compiler prints the whole IR after it); `torch.aten.histc` spelled
    aten::histc, so the region machinery can name the member and split there."""
    text = str(e)
    line = next((ln for ln in text.splitlines() if "error:" in ln), text.strip().splitlines()[0] if text.strip() else "")
    line = re.sub(r"torch\.aten\.(\w+)", r"aten::\1", line)
    return f"{type(e).__name__}: {line.strip()}"


def _device(opts):
    import iree.runtime as rt
    key = (opts["device"], opts["threads"])
    if key not in _DEVICES:
        if opts["device"].startswith("local-task"):
            # NOTE: IREE reads this when it first creates the driver: the first count in a process holds
            rt.flags.parse_flags(f"--task_topology_group_count={max(1, opts['threads'])}")
        _DEVICES[key] = rt.get_device(opts["device"], cache=False)
    return _DEVICES[key]


class IreeProgram(RegionProgram):
    def __init__(self, region, opts, vmfb: bytes):
        import iree.runtime as rt
        super().__init__(region, self.call)
        self.vmfb, self.calls, self.eager = vmfb, None, None
        ctx = rt.SystemContext(config=rt.Config(device=_device(opts)))
        module = rt.VmModule.copy_buffer(ctx.instance, vmfb)
        ctx.add_vm_module(module)
        self.main = ctx.modules[module.name]["main"]

    def call(self, *inputs):
        args = [np.require(a, requirements='C') for a in inputs]   # (ascontiguousarray makes 0-d 1-d)
        t0 = time.perf_counter_ns()
        out = self.main(*args)
        outs = [o.to_host() for o in (out if isinstance(out, (list, tuple)) else [out])]
        if self.calls is not None:
            self.calls.append((t0, time.perf_counter_ns(), [a.copy() for a in args]))
        return outs

    def artifact(self) -> bytes:
        return self.vmfb

    def start_profile(self):
        self.calls = []

    def stop_profile(self):
        calls, self.calls = self.calls or [], None
        return [c for t0, t1, args in calls for c in self._split(t0, t1, args)]

    def _split(self, t0, t1, args):
        import torch
        if self.eager is None:
            self.eager = to_torch(self.region)
            for member in self.eager.children():
                member.register_forward_pre_hook(lambda m, a: setattr(m, "t0", time.perf_counter_ns()))
                member.register_forward_hook(lambda m, a, o: self._spans.append((m, time.perf_counter_ns() - m.t0)))
        self._spans = []
        names = {id(m): n for n, m in self.eager.named_children()}
        with torch.no_grad():
            self.eager(*[torch.from_numpy(a) for a in args])
        spans = self.fitted([d for _, d in self._spans], t0, t1)
        return [self.child(names[id(m)], m.node.op, s, e, CLOCK) for (m, _), (s, e) in zip(self._spans, spans)]
