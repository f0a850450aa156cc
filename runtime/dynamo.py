"""opscope as a torch.compile backend: models torch.export cannot capture run region by region.

    model = torch.compile(model, backend="opscope", options={"backend": "sim:npu-a1"})
    model(x)             # TorchDynamo splits at graph breaks; opscope runs each region, Python the rest
    m = dynamo.compile(model, "sim:npu-a1")          # the same, keeping the run's record at hand
    m(x); m.stats()      # {"regions": 11, "graph_breaks": 10, "region_calls": ..., "placement": ...}
    with dynamo.hooked(MyHook()):                    # executor hooks on every region's ops
        m(x)
    s = open_dynamo_session("file.py:factory", "numpy"); s.run_host()    # like session.open_session

How: TorchDynamo calls `opscope_backend(gm, example_inputs, options=...)` once per region it
captured. AOTAutograd turns the region into ATen graphs -- one for inference, or a forward and a
backward when autograd is on -- and each becomes an opscope Graph (capture.translate), placed on
the backend with fallback (compile_plan) and run by the same Executor as everything else.

Regions whose shapes TorchDynamo made symbolic (a loop body that sees a different token count
per iteration) are specialised per concrete input shape at call time: opscope's graphs, cost
models and plans are static.
"""
from __future__ import annotations

import contextlib
import functools
import time
from collections import Counter
from dataclasses import dataclass, field
import numpy as np
import torch

from . import backends as _backends
from .capture import module_path, translate
from .dtypes import to_torch
from .errors import ModelError, OpscopeError, UsageError, first_line
from .executor import Executor, Plan, compile_plan
from .fallback import ASK
from .graph import Graph
from .hdi import Backend

OPTIONS = ("backend", "fallback", "hooks", "run", "model")
_OPTIONS_ASK = 'pass torch.compile options={{"backend": ..., "fallback": ["{spec}"]}}'   # ASK, for torch.compile
_HOOKS: list = []                     # hooks every region of every run sees (`hooked()`)
_SPECIALISED_LIMIT = 64               # concrete shapes kept per symbolic region
_LAST: "DynamoRun | None" = None


@contextlib.contextmanager
def hooked(*hooks):
    """Attach executor hooks to every region of every opscope-compiled model while inside."""
    _HOOKS.extend(hooks)
    try:
        yield
    finally:
        for h in hooks:
            _HOOKS.remove(h)


def opscope_backend(gm: torch.fx.GraphModule, example_inputs, *, options: dict | None = None, **_):
    """The `torch_dynamo_backends` entry point: one call per region TorchDynamo captured.

    options: backend (spec or Backend, default numpy), fallback (bool, default True, or a list of backend specs
    to try after the description's chain: ["torch:cpu"]),
    hooks (executor hooks for every region), run (a DynamoRun to record into; made and put back
    into `options["run"]` when absent), model (the root module, for full module paths).
    """
    global _LAST
    unknown = sorted(set(options or ()) - set(OPTIONS))
    if unknown:
        raise UsageError(f"opscope backend: unknown option(s) {', '.join(unknown)}; known are {', '.join(OPTIONS)}")
    if not options:
        # torch.compile passes no options when none were given: every region then shares one run
        run = _LAST if _LAST is not None and _LAST.implicit else DynamoRun("numpy")
        run.implicit, run.ask = True, _OPTIONS_ASK
    else:
        run = options.get("run")
        if run is None:
            run = options["run"] = DynamoRun(options.get("backend", "numpy"), fallback=options.get("fallback", True),
                                             hooks=options.get("hooks", ()), model=options.get("model"))
            run.ask = _OPTIONS_ASK         # made by a torch.compile call: its refusals name the options key
    _LAST = run
    return run.compile_region(gm, example_inputs)


def last_run() -> "DynamoRun | None":
    """The run that compiled the latest region (for `torch.compile` calls that kept no options)."""
    return _LAST


@dataclass
class CompiledGraph:
    """One ATen graph of a region (inference, forward or backward), run by an opscope Executor."""

    region: "Region"
    kind: str                          # "inference", "forward" or "backward"
    gm: torch.fx.GraphModule
    symbolic: bool
    plans: dict = field(default_factory=dict)      # input signature -> Executor (one when static)
    calls: int = 0
    out_devices: list = field(default_factory=list)

    def __post_init__(self):
        self.out_devices = _out_devices(self.gm)

    @property
    def name(self) -> str:
        return f"{self.region.run.name} region {self.region.index} {self.kind}"

    @property
    def executors(self) -> list[Executor]:
        return list(self.plans.values())

    @property
    def graph(self) -> Graph | None:
        """The opscope graph (the latest specialisation of a symbolic region)."""
        ex = next(reversed(self.plans.values()), None)
        return ex.plan.graph if ex is not None else None

    def prepare(self, args, prefix: str = "") -> Executor:
        key = (_signature(args) if self.symbolic else None, prefix)
        ex = self.plans.get(key)
        if ex is None:
            gm = _specialise(self.gm, args) if self.symbolic else self.gm
            graph = translate(gm.graph, self.name)
            if prefix:
                for n in graph.nodes:
                    n.module_path = f"{prefix}.{n.module_path}" if n.module_path else prefix
            if self.kind == "backward":
                self.region.link_backward(gm, graph)
            from torch._subclasses.fake_tensor import unset_fake_temporarily
            # a refusal says how to ask for a fallback where this run was made: torch.compile's options key, or
            # (the CLI's --capture dynamo) its --fallback flag
            ask = ASK.set(self.region.run.ask) if self.region.run.ask else None
            try:
                with unset_fake_temporarily():      # a lifted constant (get_attr) is a real tensor copied to the device
                    ex = Executor(compile_plan(graph, self.region.run.backend, allow_fallback=self.region.run.fallback))
            finally:
                if ask is not None:
                    ASK.reset(ask)
            if len(self.plans) >= _SPECIALISED_LIMIT:
                self.plans.pop(next(iter(self.plans)))
            self.plans[key] = ex
        return ex

    def __call__(self, args: list) -> list:
        ex = self.prepare(args, self.region.prefix(args, self.kind))
        self.calls += 1
        self.region.run.region_calls += 1
        hooks = self.region.run.active_hooks()
        if hooks:
            with ex.hooked(*hooks):
                outs = ex.run_host(*args)
        else:
            outs = ex.run_host(*args)
        return _to_torch(outs, ex.plan, self.out_devices)


@dataclass
class Region:
    """A graph TorchDynamo captured between graph breaks."""

    run: "DynamoRun"
    index: int
    param_paths: list = field(default_factory=list)   # per graph input: its path from the frame's `self`, or None
    break_reason: str = ""             # why TorchDynamo ended the region here, if at a graph break
    break_at: str = ""                 # file:line of the user code that broke the graph
    graphs: list[CompiledGraph] = field(default_factory=list)
    example_prefix: str = ""
    _prefixes: dict = field(default_factory=dict)
    _pending: list = field(default_factory=list)   # prefixes of forward calls whose backward has not run

    def prefix(self, args, kind: str) -> str:
        """Where this call's frame sits in the root model (`model.layers.1`).

        A region starts in whatever frame TorchDynamo resumed in, so node module paths are
        relative to that frame's `self`; and one compiled region serves every layer that
        shares its code (parameters are inputs), so the prefix is found per call, from a
        parameter the call reads. A backward takes the prefix of the latest forward not yet
        differentiated (autograd runs backwards in reverse order)."""
        if kind == "backward":
            return self._pending.pop() if self._pending else ""
        prefix = ""
        for i, rel in enumerate(self.param_paths):
            if rel is None or i >= len(args):
                continue
            key = id(args[i])
            if key not in self._prefixes:
                full = self.run._params.get(key, "")
                self._prefixes[key] = full[: len(full) - len(rel)].rstrip(".") if full.endswith(rel) else ""
            prefix = self._prefixes[key]
            break
        if kind == "forward":
            if len(self._pending) > 4096:         # forwards under grad mode that never ran backward
                del self._pending[:2048]
            self._pending.append(prefix)
        return prefix

    def link_backward(self, bw_gm: torch.fx.GraphModule, graph: Graph) -> None:
        """Mark a backward graph's nodes and link each to the forward node it differentiates
        (AOTAutograd gives both the autograd sequence number of the forward op)."""
        fw = next((g for g in self.graphs if g.kind == "forward"), None)
        by_seq = {}
        if fw is not None:
            for fx in fw.gm.graph.nodes:
                if fx.op == "call_function" and "seq_nr" in fx.meta:
                    by_seq.setdefault(fx.meta["seq_nr"], fx)     # the first op of the forward call
        seq_of = {fx.name: fx.meta.get("seq_nr") for fx in bw_gm.graph.nodes}
        fw_nodes = {n.name: n for n in fw.graph.nodes} if fw is not None and fw.graph is not None else {}
        for n in graph.nodes:
            # the same attrs as the joint training graph (train.joint.phase_of / forward_of read them)
            n.attrs["phase"] = "backward"
            fx = by_seq.get(seq_of.get(n.name))
            if fx is None:
                continue
            n.attrs["fwd_node"] = fx.name
            f = fw_nodes.get(fx.name)
            if f is not None and not n.source:
                n.source, n.source_line = f.source, f.source_line

    def compiler(self, kind: str):
        def compile_graph(gm, example_inputs):
            symbolic = any(_is_symbolic(v) for v in example_inputs)
            cg = CompiledGraph(self, kind, gm, symbolic)
            self.graphs.append(cg)
            if not symbolic and kind != "backward":
                # translate and place now: an op no backend runs fails at compile time
                cg.prepare(example_inputs, self.example_prefix)
            run = functools.partial(CompiledGraph.__call__, cg)
            run._boxed_call = True     # AOTAutograd passes one list of arguments
            return run
        return compile_graph


class DynamoRun:
    """What opscope compiled for one model: regions, graph breaks, and the placement of each."""

    def __init__(self, backend="numpy", *, fallback: bool = True, hooks=(), model: torch.nn.Module | None = None,
                 name: str = ""):
        self.backend: Backend = backend if isinstance(backend, Backend) else _backends.resolve(str(backend))
        # True (the description's chain), False, or that chain plus these specs (runtime/fallback.py)
        self.fallback = list(fallback) if isinstance(fallback, (list, tuple)) else bool(fallback)
        self.hooks = list(hooks)
        self.regions: list[Region] = []
        self.region_calls = 0
        self.implicit = False          # made for a torch.compile call without options
        self.ask = None                # how a refusal says to add a fallback (runtime/fallback.py ASK); None: the CLI's
        self.name = name or (type(model).__name__ if model is not None else "model")
        self._params = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)} if model is not None else {}
        self._params.update({id(b): n for n, b in model.named_buffers(remove_duplicate=False)} if model is not None else {})

    # --- torch.compile ---------------------------------------------------------------
    def compile_region(self, gm: torch.fx.GraphModule, example_inputs):
        from torch._dynamo.backends.common import aot_autograd

        region = Region(self, len(self.regions), _param_paths(gm))
        region.example_prefix = region.prefix(example_inputs, "inference")
        reason = getattr(gm, "compile_subgraph_reason", None)
        if reason is not None and reason.graph_break:
            region.break_reason = (str(reason.reason).strip().splitlines() or ["graph break"])[0]
            frame = reason.user_stack[-1] if reason.user_stack else None
            region.break_at = f"{frame.filename}:{frame.lineno}" if frame is not None else ""
        self.regions.append(region)
        return aot_autograd(fw_compiler=region.compiler("forward"), bw_compiler=region.compiler("backward"),
                            inference_compiler=region.compiler("inference"))(gm, example_inputs)

    # --- hooks -----------------------------------------------------------------------
    def active_hooks(self) -> list:
        return self.hooks + _HOOKS if _HOOKS else self.hooks

    @contextlib.contextmanager
    def hooked(self, *hooks):
        self.hooks.extend(hooks)
        try:
            yield self
        finally:
            for h in hooks:
                self.hooks.remove(h)

    # --- what happened ---------------------------------------------------------------
    @property
    def graphs(self) -> list[CompiledGraph]:
        return [g for r in self.regions for g in r.graphs]

    @property
    def plans(self) -> list[Plan]:
        return [ex.plan for g in self.graphs for ex in g.executors]

    def break_reasons(self) -> dict[str, int]:
        """Why regions ended: reason (and where) -> how many regions ended so."""
        return dict(Counter(f"{r.break_reason} ({r.break_at})" if r.break_at else r.break_reason
                            for r in self.regions if r.break_reason))

    @property
    def graph_breaks(self) -> int:
        """Counted as torch._dynamo.explain counts them: regions - 1 (a resumed frame, a
        recompilation for new shapes and a break each start a region)."""
        return max(len(self.regions) - 1, 0)

    def placement(self) -> dict:
        """Placement of every region's plan, added up like Placement.report()."""
        per_backend: Counter = Counter()
        fell: dict[str, dict] = {}
        transfers = transfer_bytes = 0
        for plan in self.plans:
            rep = plan.placement.report()
            per_backend.update(rep["nodes_per_backend"])
            transfers += rep["transfers"]
            transfer_bytes += rep["transfer_bytes"]
            for f in rep["fallback_ops"]:
                f0 = fell.setdefault(f["op"], {**f, "nodes": 0})
                f0["nodes"] += f["nodes"]
        return {"nodes_per_backend": dict(per_backend), "fallback_ops": sorted(fell.values(), key=lambda r: r["op"]),
                "transfers": transfers, "transfer_bytes": transfer_bytes,
                # regions a compiler stack failed and split (runtime/partition.py), in every graph
                "splits": [sp.row() for plan in self.plans for sp in plan.placement.splits]}

    def stats(self) -> dict:
        return {"backend": self.backend.name, "regions": len(self.regions), "graph_breaks": self.graph_breaks,
                "break_reasons": self.break_reasons(), "graphs": len(self.graphs), "region_calls": self.region_calls,
                "nodes": sum(len(g.graph.nodes) for g in self.graphs if g.graph is not None), "placement": self.placement()}


class DynamoModel:
    """A model compiled with the opscope backend, and the DynamoRun (`.dynamo`) that records it."""

    def __init__(self, model: torch.nn.Module, backend="numpy", *, fallback: bool = True, hooks=(), **compile_kwargs):
        self.model = model
        self.dynamo = DynamoRun(backend, fallback=fallback, hooks=hooks, model=model)
        self.compiled = torch.compile(model, backend="opscope", options={"run": self.dynamo}, **compile_kwargs)

    def __call__(self, *args, **kwargs):
        return self.compiled(*args, **kwargs)

    def stats(self) -> dict:
        return self.dynamo.stats()

    def hooked(self, *hooks):
        return self.dynamo.hooked(*hooks)


def compile(model: torch.nn.Module, backend="numpy", **kwargs) -> DynamoModel:  # noqa: A001 - torch.compile's name
    """`torch.compile(model, backend="opscope", ...)`, keeping the DynamoRun at hand."""
    return DynamoModel(model, backend, **kwargs)


@dataclass
class DynamoSession:
    """open_session's counterpart for the torch.compile path: `.run()`, `.run_host()`, `.eager()`."""

    spec: str
    model: torch.nn.Module
    inputs: tuple
    compiled: DynamoModel
    capture_seconds: float = 0.0

    @property
    def backend(self) -> Backend:
        return self.compiled.dynamo.backend

    @property
    def dynamo(self) -> DynamoRun:
        return self.compiled.dynamo

    def hooked(self, *hooks):
        return self.compiled.hooked(*hooks)

    def run(self) -> list:
        """The model's outputs, flattened, as numpy arrays (regions ran on the backend)."""
        from .session import eager_outputs
        return eager_outputs(self.compiled, self.inputs)

    run_host = run

    def eager(self) -> list[np.ndarray]:
        from .session import eager_outputs
        return eager_outputs(self.model, self.inputs)


def open_dynamo_session(model_spec: str, backend_spec: str, *, allow_fallback: bool = True, model=None, inputs=None,
                        hooks=()) -> DynamoSession:
    """Load a model spec and compile it with the opscope backend; the first run happens here,
    so compilation errors surface now and `capture_seconds` is the compile time."""
    from . import models

    backend = _backends.resolve(backend_spec)        # bad backend spec fails before the model loads
    if model is None:
        model, inputs = models.load(model_spec)
    # NOTE: TorchDynamo keeps compiled code per code object and gives up (runs eager, silently)
    # past torch._dynamo.config.recompile_limit; a fresh session starts from a clean cache.
    torch._dynamo.reset()
    compiled = DynamoModel(model, backend, fallback=allow_fallback, hooks=hooks)
    s = DynamoSession(model_spec, model, tuple(inputs), compiled)
    t0 = time.perf_counter()
    try:
        s.run()
    except OpscopeError:
        raise
    except Exception as e:  # TorchDynamo wraps what a backend raises (BackendCompilerFailed)
        cause = _opscope_cause(e)
        if cause is not None:
            raise cause from e
        raise ModelError(f"{model_spec} failed under torch.compile: {type(e).__name__}: {first_line(e)}") from e
    s.capture_seconds = time.perf_counter() - t0
    return s


def _opscope_cause(e: BaseException) -> OpscopeError | None:
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OpscopeError):
            return e
        seen.add(id(e))
        e = getattr(e, "inner_exception", None) or e.__cause__ or e.__context__
    return None


# --- helpers -------------------------------------------------------------------------------
def _param_paths(gm: torch.fx.GraphModule) -> list:
    """Per graph input, the parameter or buffer path TorchDynamo read it from, relative to the
    frame's `self` (`self_attn.q_proj.weight`), or None for other inputs."""
    paths = []
    for node in gm.graph.find_nodes(op="placeholder"):
        source = getattr(node.meta.get("grapharg"), "source", None)
        name = source.name if source is not None else ""
        if "._parameters['" in name or "._buffers['" in name:
            rel = module_path(name.replace("._parameters['", "._modules['").replace("._buffers['", "._modules['"))
            paths.append(rel)
        else:
            paths.append(None)
    return paths


def _is_symbolic(v) -> bool:
    if isinstance(v, torch.SymInt):
        return True
    return isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in v.shape)


def _signature(args) -> tuple:
    return tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


def _specialise(gm: torch.fx.GraphModule, args) -> torch.fx.GraphModule:
    """Retrace a symbolic ATen graph with these concrete inputs: same ops, static shapes.
    preserve_node_meta carries each node's module path and source line across."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.traceback import preserve_node_meta

    with preserve_node_meta():
        return make_fx(torch.fx.Interpreter(gm).run, tracing_mode="fake")(*args)


def _out_devices(gm: torch.fx.GraphModule) -> list:
    outs = gm.graph.output_node().args[0]
    return [getattr(o.meta.get("val"), "device", None) if isinstance(o, torch.fx.Node) else None for o in outs]


def _to_torch(outs: list, plan: Plan, devices: list) -> list:
    """Host outputs back to torch tensors of the graph's dtypes (numpy computes bfloat16 in float32)
    on the devices the graph promised."""
    from .graph import Ref

    result = []
    for ref, v, dev in zip(plan.output_refs, outs, devices):
        if isinstance(ref, Ref) and isinstance(v, (np.ndarray, np.generic)):
            v = np.asarray(v)
            t = torch.from_numpy(v if v.flags.c_contiguous and v.flags.writeable else v.copy())
            meta = plan.graph.slot_meta.get(ref.slot)
            if meta is not None and t.dtype != to_torch(meta.dtype):
                t = t.to(to_torch(meta.dtype))
            if dev is not None and dev.type != "cpu":
                t = t.to(dev)
            result.append(t)
        else:
            result.append(v)
    return result
