"""xla[:PLATFORM]: each region lowered to jax.numpy / jax.lax and compiled by XLA through jax.jit.

    opscope run demo:gpt -b xla                # cpu
    opscope run demo:gpt -b xla:cuda           # where a jax CUDA plugin is installed (rocm, tpu likewise)

claim: the ATen ops LOWER has a jax function for (same signature as the ATen op; everything else stays on
the fallback); compile: one jitted function of (parameters, inputs) for the region, every member inside a
`jax.named_scope` of its node name. Parameters go to the device once, as arguments (not literals folded
into the HLO, which would make compiling slow and the program big).
NOTE: torch_xla does not load beside this torch, and torchax needs patching: the lowering is opscope's own.
"""
from __future__ import annotations

import math
import re
import time

import numpy as np

from ..description import Description
from ..errors import UsageError, first_line
from ..hdi import Backend
from ..partition import StackFailed
from ..graph import materialize
from ..region_check import REDUCED_PRECISION_TOLERANCE, TOLERANCE
from ..regions import Claim, Region, RegionProgram
from ..stack_registry import StackRegistry
from ..regions import example_inputs as _examples
from .numpy_backend import NumpyMemory
from .xla_lowering import more_lowerings, scatter_into

INSTALL = 'pip install "jax[cpu]" (or opscope[xla])'
CLOCK = ("xla profiler: XLA's thunk-executor spans, in their order, scaled to fit the region's call (the gaps "
         "between thunks, the call's own dispatch, shared out)")
_MARK = "opscope-region-call"


def _div(a, b, rounding_mode=None):
    """ATen's div, its rounding modes too (the region value check found them ignored: OpInfo's div samples)."""
    import jax.numpy as jnp
    if rounding_mode == "floor":
        return jnp.floor_divide(a, b)         # (python's floor division on floats too, as ATen's div_floor)
    q = jnp.true_divide(a, b)
    return jnp.trunc(q) if rounding_mode == "trunc" else q


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    import jax
    import jax.numpy as jnp
    s = jnp.matmul(q, jnp.swapaxes(k, -1, -2)) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        s = jnp.where(jnp.tril(jnp.ones((q.shape[-2], k.shape[-2]), dtype=bool)), s, -jnp.inf)
    if attn_mask is not None:
        s = jnp.where(attn_mask, s, -jnp.inf) if attn_mask.dtype == bool else s + attn_mask
    return jnp.matmul(jax.nn.softmax(s, axis=-1), v)


def _layer_norm(x, shape, w=None, b=None, eps=1e-5, cudnn=None):
    import jax.numpy as jnp
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    y = (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)
    return y * (w if w is not None else 1) + (b if b is not None else 0)


def _split(x, size, dim=0):
    import jax.numpy as jnp
    return jnp.split(x, list(range(size, x.shape[dim], size)), axis=dim)


def _lower() -> dict:
    """ATen schema name -> a jax function of the same arguments (device, layout, ... kwargs ignored)."""
    import jax
    import jax.numpy as jnp
    return {
        "aten::arange": lambda *a, **_: jnp.arange(*a),
        "aten::embedding": lambda w, idx, *_, **__: jnp.take(w, idx, axis=0),
        "aten::add": lambda a, b, alpha=1: a + alpha * b,
        "aten::sub": lambda a, b, alpha=1: a - alpha * b,
        "aten::mul": lambda a, b: a * b,
        "aten::div": _div,
        "aten::layer_norm": _layer_norm,
        "aten::linear": lambda x, w, b=None: x @ w.T + (b if b is not None else 0),
        "aten::addmm": lambda c, a, b, beta=1, alpha=1: beta * c + alpha * (a @ b),
        "aten::mm": jnp.matmul, "aten::bmm": jnp.matmul, "aten::matmul": jnp.matmul,
        "aten::t": lambda x: x.T,
        "aten::split": _split,
        "aten::view": lambda x, shape: jnp.reshape(x, shape),
        "aten::reshape": lambda x, shape: jnp.reshape(x, shape),
        "aten::transpose": lambda x, a, b: jnp.swapaxes(x, a, b),
        "aten::permute": lambda x, dims: jnp.transpose(x, dims),
        "aten::scaled_dot_product_attention": _sdpa,
        "aten::gelu": lambda x, approximate="none": jax.nn.gelu(x, approximate=approximate == "tanh"),
        "aten::relu": jax.nn.relu, "aten::tanh": jnp.tanh, "aten::exp": jnp.exp, "aten::sigmoid": jax.nn.sigmoid,
        "aten::silu": jax.nn.silu,
        "aten::softmax": lambda x, dim, half_to_float=False: jax.nn.softmax(x, axis=dim),
        "aten::_softmax": lambda x, dim, half_to_float=False: jax.nn.softmax(x, axis=dim),
        "aten::mean": lambda x, dim=None, keepdim=False, dtype=None: x.mean(axis=tuple(dim) if dim else None,
                                                                            keepdims=keepdim),
    }


def platform(desc: Description) -> str:
    return (desc.options.get("device") or "cpu").lower()


def available(desc: Description) -> tuple[bool, str]:
    import importlib.util
    if importlib.util.find_spec("jax") is None or importlib.util.find_spec("jaxlib") is None:
        return False, f"not installed: {INSTALL}"
    if platform(desc) == "cpu":            # jaxlib always has it; importing jax (seconds, threads) can wait
        return True, ""
    import jax
    try:
        jax.devices(platform(desc))
    except RuntimeError as e:
        return False, (f"jax has no {platform(desc)} platform here ({first_line(e)[:120]}); "
                       f"install its PJRT plugin, or use one of: {', '.join(devices())}")
    return True, ""


def devices() -> list[str]:
    import jax
    return sorted({d.platform for d in jax.devices()})


class XlaBackend(Backend):
    pass


class JaxMemory(NumpyMemory):
    def to_host(self, buf):
        # NOTE: np.asarray of a jax array is a read-only view of XLA's buffer; a fallback's in-place op on
        # it would write into jax's memory (torch warns as much). A copy is the transfer.
        return np.array(buf)


def create(desc: Description, name: str) -> XlaBackend:
    try:
        import jax
    except ImportError as e:             # found but broken (a jaxlib that does not match jax, ...)
        raise UsageError(f"backend {name} is not available: jax does not import ({first_line(e)}); {INSTALL}")
    if desc.options.get("threads") or desc.options.get("providers") or desc.options.get("precision", "f32") != "f32":
        raise UsageError(f"backend {name}: the xla backend takes only [backend.options] device (threads, providers "
                         "and precision are not its options); remove the others from the description")
    jax.config.update("jax_enable_x64", True)      # int64 indices stay int64, a float64 graph stays float64
    # a region call waits for its outputs anyway: run it on the calling thread, not hop to the client's (under
    # load that thread waited for a core for milliseconds inside the call, time no op of the region spent)
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    lower = more_lowerings(_lower())          # training's backward and optimizer ops too: xla_lowering.py
    takes = Claim()

    def claim(node):
        ok = takes(node)
        if ok is True and node.target._schema.name not in lower:
            return f"{node.op}: the xla backend has no jax lowering for {node.target._schema.name}"
        return ok
    dev = jax.devices(platform(desc))[0]
    backend = XlaBackend(name=name, description=desc, ops=None, memory=JaxMemory(), device=f"xla:{dev.platform}")
    # every region checked against ATen at compile (region_check.py): opscope's own lowering can run and be wrong.
    # XLA's CPU computes float32 as ATen does (a region's rounding stays near 1e-6); on GPU and TPU jax's default
    # matmul precision is TF32 / bf16 passes: a gross error only
    tolerance = TOLERANCE if dev.platform == "cpu" else REDUCED_PRECISION_TOLERANCE
    backend.ops = StackRegistry(claim, lambda region: compile_region(region, lower, dev),
                                unsupported=desc.unsupported, supported=desc.supported, stack="xla",
                                tolerance=tolerance)
    return backend


class XlaProgram(RegionProgram):
    def __init__(self, region: Region, lower: dict, device):
        import jax
        super().__init__(region, self._run)
        self.device = device
        slots = list(region.constants)
        self.consts = [jax.device_put(np.asarray(region.constants[s].detach().numpy()), device) for s in slots]
        members = region.members
        mutated = _mutated(region)

        def run(consts, *inputs):
            env = dict(zip(region.inputs, inputs)) | dict(zip(slots, consts))
            for m in members:
                with jax.named_scope(m.name):     # the profiler's spans carry the node's name
                    kwargs = {k: materialize(v, env) for k, v in m.kwargs.items()}    # attn_mask= is a Ref
                    out = lower[m.target._schema.name](*materialize(m.args, env), **_keep(kwargs))
                outs = list(out) if m.multi_output else [out]
                for s, v, meta in zip(m.outputs, outs, m.output_meta):
                    env[s] = v.astype(meta.dtype) if meta is not None and str(v.dtype) != meta.dtype else v
                for slot, view in mutated.get(m.name, ()):   # an in-place op: later readers see the new value
                    env[slot] = env[m.outputs[0]] if view is None else _write_back(env[slot], view, env)
            return tuple(env[s] for s in region.outputs)
        self.fn = jax.jit(run)
        self._block = jax.block_until_ready
        # NOTE: every input goes to the device first: a region fed by another region gets a jax array, one fed
        # by the host a numpy array, and jit compiles each kind anew (1.4 s per region in the first step)
        self._put = lambda xs: jax.device_put(list(xs), device)

    def _run(self, *inputs):
        # NOTE: jax dispatches asynchronously; waiting here makes the region's timed call its compute time
        if self._calls is None:
            return list(self._block(self.fn(self.consts, *self._put(inputs))))
        import jax
        with jax.profiler.TraceAnnotation(self._mark):    # the trace's clock for this call: children are placed by it
            t0 = time.perf_counter_ns()
            out = list(self._block(self.fn(self.consts, *self._put(inputs))))
            t1 = time.perf_counter_ns()
        self._calls.append((t0, t1))
        return out

    _calls = None
    _covers = None

    @property
    def _mark(self) -> str:
        return f"{_MARK} {self.region.name}"

    def start_profile(self):
        _TRACE.start()
        self._calls = []

    def stop_profile(self):
        calls, self._calls = self._calls, None
        data = _TRACE.stop()
        if not calls or data is None:
            return []
        if self._covers is None:          # the HLO XLA compiled: its instructions name the thunks that ran
            hlo = self.fn.lower(self.consts, *self._put(x.numpy() for x in _examples(self.region))).compile().as_text()
            self._covers = covers(hlo, self.region)
        thunks, marks = [], []                # a thunk's event is named by its instruction (its hlo_op stat)
        for ev in (ev for plane in data.planes for line in plane.lines for ev in line.events):
            if ev.name == self._mark:
                marks.append((ev.start_ns, ev.start_ns + ev.duration_ns))
            elif ev.name in self._covers:     # another region's thunk of that name lies outside this one's marks
                thunks.append((ev.start_ns, ev.start_ns + ev.duration_ns, ev.name))
        children = []
        for (t0, t1), (lo, hi) in zip(calls, sorted(marks)):
            inside = [(s, e, op) for s, e, op in sorted(thunks) if lo <= s and e <= hi and op in self._covers]
            # NOTE: the thunks alone covered as little as 52% of a call (host dispatch between them, the
            # annotation's own cost): in order, scaled to the call, so the children account for its whole time
            for (s, e, op), (c0, c1) in zip(inside, self.fitted([e - s for s, e, _ in inside], t0, t1)):
                kind, members = self._covers[op]
                children.append(self.child(op, kind, c0, c1, CLOCK, members))
        return children


def _mutated(region: Region) -> dict[str, list]:
    """In-place members -> the slots each overwrites, in order: [(slot, None)] for the value it mutates, then, where
    that value is a select/slice view (`u[:, 0, 0] = 0.5`: a fill_ through two selects), (base slot, view member)
    up the chain to its base. jax has no aliasing, so the program rebinds those slots, writing each view back into
    its base (_write_back). It can only when the base is made in the region by an op that is not a view (a value
    from outside the region would keep the old value): otherwise compiling refuses, and the member goes to the
    fallback."""
    from ..ops import OPS
    from .xla_lowering import IN_PLACE
    made = {s: m for m in region.members for s in m.outputs}
    out = {}
    for i, m in enumerate(region.members):
        if m.target._schema.name not in IN_PLACE:
            continue
        slot = m.args[0].slot if m.args and hasattr(m.args[0], "slot") else None
        chain, maker = [(slot, None)], made.get(slot)
        while maker is not None and maker.op in _WRITABLE_VIEWS and hasattr(maker.args[0], "slot"):
            chain.append((maker.args[0].slot, maker))
            maker = made.get(maker.args[0].slot)
        if maker is None or getattr(OPS.get(maker.op), "kind", "") == "view":
            # named by its scope /n<i>/: the split (partition.py) sends this member alone to the fallback
            raise NotImplementedError(f"in-place member /n{i}/ ({m.name}) writes a value from outside the region "
                                      "or a view jax cannot write through")
        out[m.name] = chain
    return out


# views whose elements _write_back can put back into their base
_WRITABLE_VIEWS = frozenset({"select", "slice"})


def _write_back(base, view, env):
    """`base` with the elements `view` (select or slice of it) selects replaced by the view's new value."""
    if view.op == "select":
        args = view.args[1:3]
    else:                          # slice(x, dim=0, start=None, end=None, step=1), its defaults left out
        args = (list(view.args[1:]) + [0, None, None, 1][len(view.args) - 1:])[:4]
    return scatter_into(base, env[view.outputs[0]], *args)


class _Trace:
    """One jax profiler session for every region's program (jax runs one at a time): started by the first
    start_profile, stopped and read by the first stop_profile, its data handed to the others."""
    users, session, data = 0, None, None

    def start(self):
        import jax
        if self.users == 0:
            # NOTE: the session jax.profiler.start_trace opens, read in memory: start/stop_trace also writes
            # the trace to disk (an xplane and a gzipped JSON), 44 ms a step on demo:gpt against 0.5 ms here
            from jax._src.lib import _profiler
            opts = jax.profiler.ProfileOptions()
            opts.python_tracer_level = 0          # Python frames: costly, and not what a region's children are
            self.session, self.data = _profiler.ProfilerSession(opts), None
        self.users += 1

    def stop(self):
        import jax
        if self.users and self.data is None:
            session, self.session = self.session, None
            self.data = jax.profiler.ProfileData.from_serialized_xspace(session.stop())
        self.users, data = max(0, self.users - 1), self.data
        self.data = self.data if self.users else None
        return data


_TRACE = _Trace()
_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = \S+(?: \S+)*? ([\w\-]+)\((.*)$")


def covers(hlo: str, region: Region) -> dict[str, tuple[str, list]]:
    """Each instruction of the compiled HLO's entry (what runs as a thunk: a fusion, a dot, a custom call) ->
    its opcode and the members named (jax.named_scope) in its metadata and in the computations it calls (a
    fusion's body). Members that vanished (a reshape made a bitcast keeps no metadata) RegionProgram.absorb places."""
    by_name = {m.name: m for m in region.members}
    instrs, comps, entry, comp = {}, {}, None, None      # name -> (opcode, names it references, members)
    for line in hlo.splitlines():
        if head := re.match(r"^(ENTRY )?%([\w.\-]+) ", line):
            comp, entry = head.group(2), head.group(2) if head.group(1) else entry
            comps[comp] = []
        elif (m := _INSTR.match(line)) and comp is not None:
            op_name = re.search(r'op_name="([^"]*)"', line)
            mine = [by_name[p] for p in (op_name.group(1).split("/") if op_name else []) if p in by_name]
            instrs[m.group(1)] = (m.group(2), re.findall(r"%([\w.\-]+)", m.group(3)), mine)
            comps[comp].append(m.group(1))

    def members(name, seen):
        kind, refs, mine = instrs[name]
        for called in (r for r in refs if r in comps and r not in seen):
            seen.add(called)
            mine = mine + [x for n in comps[called] for x in members(n, seen)]
        return list({id(x): x for x in mine}.values())
    return {top: (instrs[top][0], members(top, set())) for top in comps.get(entry, [])}


def _keep(kwargs: dict) -> dict:
    """Capture's device keywords mean nothing to jax: the program runs where it was compiled."""
    return {k: v for k, v in kwargs.items() if k not in ("device", "layout", "pin_memory", "dtype", "memory_format")}


def compile_region(region: Region, lower: dict, device) -> XlaProgram:
    try:
        program = XlaProgram(region, lower, device)
        program(*[x.numpy() for x in _examples(region)])       # trace and compile now, not in the first step
        return program
    except Exception as e:       # a lowering that does not fit the arguments, or XLA refusing the program
        raise StackFailed("xla", region, e) from e
