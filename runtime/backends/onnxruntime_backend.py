"""onnxruntime[:PROVIDER]: each region is exported to ONNX and run by an InferenceSession.

    opscope run demo:gpt -b onnxruntime                          # CPUExecutionProvider
    opscope run demo:gpt -b onnxruntime:CUDAExecutionProvider    # where onnxruntime-gpu is installed

claim: any node with an ATen target whose dtypes ONNX Runtime computes in (the description may refuse
more); compile: the region as a torch module (regions.to_torch) through torch's TorchScript ONNX exporter,
every member in its own scope `/n<i>/`, so the per-node spans of ONNX Runtime's own profile
(`enable_profiling`) map back to the opscope nodes they came from.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import time
import warnings

import numpy as np

from ..description import Description
from ..export_forms import form
from ..hdi import Backend
from ..partition import StackFailed
from ..region_check import REDUCED_PRECISION_TOLERANCE, TOLERANCE
from ..regions import Claim, Region, RegionProgram, example_inputs, to_torch
from ..stack_registry import StackRegistry
from .numpy_backend import NumpyMemory

INSTALL = "pip install onnxruntime (or opscope[onnxruntime])"
OPSET = 17
CLOCK = "onnxruntime profiler"
# short spellings a user types after `onnxruntime:` -> the provider's own name
_SHORT = {"cpu": "CPU", "cuda": "CUDA", "rocm": "ROCM", "tensorrt": "Tensorrt", "openvino": "OpenVINO",
          "qnn": "QNN", "coreml": "CoreML", "dml": "Dml", "migraphx": "MIGraphX"}


def providers(desc: Description) -> list[str]:
    """The execution providers, in order: `device` (from the spec) first, else the description's list."""
    device = desc.options.get("device")
    given = [device] if device else list(desc.options.get("providers") or ["CPUExecutionProvider"])
    names = [p if p.endswith("ExecutionProvider") else _SHORT.get(p.lower(), p) + "ExecutionProvider" for p in given]
    if "CPUExecutionProvider" not in names:        # what a provider leaves out runs on the CPU provider
        names.append("CPUExecutionProvider")
    return names


def available(desc: Description) -> tuple[bool, str]:
    try:
        import onnxruntime as ort
    except ImportError:
        return False, f"not installed: {INSTALL}"
    here = ort.get_available_providers()
    for p in providers(desc):
        if p not in here:
            return False, (f"execution provider {p} is not available here (this onnxruntime has "
                           f"{', '.join(here)}); install the onnxruntime build that has it, or pick one of those")
    return True, ""


def devices() -> list[str]:
    import onnxruntime as ort
    return list(ort.get_available_providers())


class OnnxRuntimeBackend(Backend):
    pass


def create(desc: Description, name: str) -> OnnxRuntimeBackend:
    chosen = providers(desc)
    backend = OnnxRuntimeBackend(name=name, description=desc, ops=None, memory=NumpyMemory(),
                                 device=f"onnxruntime:{chosen[0]}")
    import onnxruntime as ort
    # every region checked against ATen at compile (region_check.py): an exported form can run and be wrong, as
    # OpenVINO's copy was. The CPU provider computes float32 as ATen does (a whole region's rounding stays near
    # 1e-6); a GPU provider may multiply in TF32 (CUDA's default) or half precision (TensorRT): a gross error only
    tolerance = TOLERANCE if chosen[0] == "CPUExecutionProvider" else REDUCED_PRECISION_TOLERANCE
    backend.ops = StackRegistry(claim, lambda region: compile_region(region, desc, chosen),
                                unsupported=desc.unsupported, supported=desc.supported,
                                load=lambda region, blob: load_region(region, blob, desc, chosen),
                                version=f"onnxruntime {ort.__version__}", stack="onnxruntime", tolerance=tolerance)
    return backend


_TAKES = Claim()
# ops whose torch form covers bools only (a logical op); on integers they need ONNX's Bitwise* ops, opset 18
BOOL_ONLY = {"aten::bitwise_and": "and"}


def claim(node) -> bool | str:
    """Ops with an ATen target in dtypes ONNX Runtime computes in, that torch's exporter has a symbolic for
    (a backward op such as mse_loss_backward has none: it stays on the fallback, op by op)."""
    ok = _TAKES(node)
    if ok is not True:
        return ok
    # An empty tensor in: some of ONNX Runtime's CPU kernels divide by its dims (im2col, unfold on an empty batch,
    # dies of SIGFPE -- the whole process, no exception to split on); the fallback computes nothing anyway.
    if any(m is not None and 0 in m.shape for m in node.input_meta):
        return f"{node.op}: an input has no elements, on which some ONNX Runtime kernels crash the process"
    name = node.target._schema.name
    exportable = _exportable()
    if name in BOOL_ONLY and any(m is not None and m.dtype != "bool" for m in node.input_meta):
        return f"{node.op} on integers: ONNX has no bitwise {BOOL_ONLY[name]} before opset 18 (this exports {OPSET})"
    if form(node.target) is not None:              # exported as its torch form (export_forms.py)
        return True
    if exportable is not None and not any(exportable(n, OPSET) for n in spellings(name)):
        return f"{node.op}: torch's ONNX exporter has no symbolic for {name} at opset {OPSET}"
    return True


def spellings(name: str) -> list[str]:
    """The names the exporter's registry may know an ATen op by: its own, the out-of-place op of an in-place one
    (the exporter rewrites `add_` as `add` before it looks up a symbolic), and a dunder op as the registry spells
    it (`aten::__and__` is registered as `aten::__and_`, a Python function name)."""
    ns, _, op = name.partition("::")
    if op.startswith("__") and op.endswith("__"):
        return [name, f"{ns}::{op[:-1]}", f"{ns}::{op.strip('_')}"]
    return [name, f"{ns}::{op[:-1]}"] if op.endswith("_") else [name]


def _exportable():
    """The TorchScript exporter's registry lookup, its symbolic modules loaded (they register on import);
    None where this torch keeps it elsewhere (then a region that cannot export fails when compiled)."""
    import importlib
    try:
        base = "torch.onnx._internal.torchscript_exporter"
        for v in range(7, OPSET + 1):
            importlib.import_module(f"{base}.symbolic_opset{v}")
        return importlib.import_module(f"{base}.registration").registry.is_registered_op
    except (ImportError, AttributeError):
        return None


def export(region: Region) -> bytes:
    """The region as an ONNX model (inputs i0.., outputs o0.., members scoped /n<i>/)."""
    import torch
    # NOTE: on a graph it cannot take, the exporter dumps the whole TorchScript graph to stdout (C++
    # std::cout, whatever Python's sys.stdout is), which breaks --json; stderr it is
    torch._C._jit_set_onnx_log_output_stream("stderr")
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # the TorchScript exporter's deprecation notice, tracer warnings
        torch.onnx.export(to_torch(region), example_inputs(region), f, dynamo=False, opset_version=OPSET,
                          input_names=[f"i{k}" for k in range(len(region.inputs))],
                          output_names=[f"o{k}" for k in range(len(region.outputs))], do_constant_folding=True)
    return f.getvalue()


class OrtProgram(RegionProgram):
    def __init__(self, region: Region, model: bytes, desc: Description, chosen: list[str]):
        super().__init__(region, self._run)
        self.model, self.desc, self.chosen = model, desc, chosen
        self.session = self._session(model)
        self.binding = self.session.io_binding()
        self.names = [i.name for i in self.session.get_inputs()]
        self.outs = [o.name for o in self.session.get_outputs()]

    def artifact(self) -> bytes:
        return self.model                  # the exported ONNX model: a plan saves it (passes/plan_regions.py)

    def _session(self, model: bytes, profile_dir: str | None = None, optimized: bool = False):
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = int(self.desc.options.get("threads", 0))
        so.log_severity_level = 4
        ort.set_default_logger_severity(4)    # a run's own errors: opscope reports them, once (ORT logged each)
        if profile_dir:
            so.enable_profiling = True
            so.profile_file_prefix = os.path.join(profile_dir, "ort")
        if optimized:                      # the optimized graph as ONNX Runtime saved it: nothing left to fuse
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        elif profile_dir:
            so.optimized_model_filepath = os.path.join(profile_dir, "optimized.onnx")
        return ort.InferenceSession(model, so, providers=self.chosen)

    def _covers(self, optimized) -> dict[str, list]:
        """Node name in the optimized graph -> the members it runs. A node ONNX Runtime made (a fusion, a
        Gemm's reshape) is named by no scope: walk back from its outputs through the exported graph to the
        tensors the optimized graph still has; every member met on the way is one it covers."""
        exported = _onnx().load_from_string(self.model).graph
        producer = {o: n for n in exported.node for o in n.output}
        kept = {t for n in optimized.node for t in list(n.input) + list(n.output)}
        covers = {}
        for node in optimized.node:
            seen, todo, members = set(), list(node.output), []
            while todo:
                src = producer.get(todo.pop())
                if src is None or src.name in seen:
                    continue
                seen.add(src.name)
                m = self.region.member_of_scope(src.name)
                if m is not None and m not in members:
                    members.append(m)
                todo += [t for t in src.input if t not in kept]
            covers[node.name] = members
        return covers

    def _call(self, session, binding, inputs):
        # NOTE: I/O binding: the inputs are read where they lie and the outputs are ORT's own buffers, handed
        # out as numpy views (each call allocates its own, so an earlier step's outputs stay as they were)
        # NOTE: by name, not position: the exporter drops an input the graph never reads (a layer norm's bias
        # whose backward form only asks whether it is None), so i<k> is the k-th input, not the k-th name
        for n in self.names:
            binding.bind_cpu_input(n, np.ascontiguousarray(inputs[int(n[1:])]))
        for n in self.outs:
            binding.bind_output(n, "cpu")
        session.run_with_iobinding(binding)
        # NOTE: the TorchScript exporter gives a 0-d result shape (1,) (82 OpInfos came back wrong): the region's own shape
        return [_shaped(o.numpy(), self.region.slot_meta.get(s)) for o, s in zip(binding.get_outputs(), self.region.outputs)]

    def _run(self, *inputs):
        if self._profiled is None:
            return self._call(self.session, self.binding, inputs)
        t0 = time.perf_counter_ns()
        out = self._call(self._profiled, self._profiled_binding, inputs)
        self._calls.append((t0, time.perf_counter_ns()))
        return out

    # NOTE: ONNX Runtime's Python API ends a session's profile for good at end_profiling() (it has no
    # start_profiling, and RunOptions' run-level profiling is C API only), so each profiled step needs a
    # session of its own, made before the step and read after it, neither inside the region's timed call.
    # The first one's optimized graph is kept: later ones load it with optimizations off (no fusing again)
    # and keep its node names, so the map from nodes to members is made once.
    _profiled = None
    _optimized = None
    _cover_map = None

    def start_profile(self):
        self._folder = tempfile.mkdtemp(prefix="opscope-ort-")
        if self._optimized is None:
            self._profiled = self._session(self.model, self._folder)
        else:
            self._profiled = self._session(self._optimized, self._folder, optimized=True)
        self._profiled_binding, self._calls = self._profiled.io_binding(), []
        # NOTE: a new session's first run plans and allocates its memory between kernels (a step's
        # kernels then summed to 86% of the region's time); one run here takes that, and is dropped
        self._call(self._profiled, self._profiled_binding, [x.numpy() for x in example_inputs(self.region)])

    def stop_profile(self):
        if self._profiled is None:
            return []
        try:
            with open(self._profiled.end_profiling()) as f:
                events = json.load(f)
            if self._optimized is None:
                path = os.path.join(self._folder, "optimized.onnx")
                with open(path, "rb") as f:
                    self._optimized = f.read()
                self._cover_map = self._covers(_onnx().load_from_string(self._optimized).graph) if _onnx() else {}
        finally:
            self._profiled = self._profiled_binding = None
            shutil.rmtree(self._folder, ignore_errors=True)
        runs = [e for e in events if e.get("name") == "model_run"][1:]     # after start_profile's own run
        children = []
        for (t0, t1), run in zip(self._calls, runs):     # one model_run per call, in order
            lo, hi = run["ts"], run["ts"] + run["dur"]
            scale = (t1 - t0) / (run["dur"] * 1000) if run["dur"] else 1.0   # the profiler's us onto the call
            for e in events:
                name = e.get("name", "")
                if e.get("cat") == "Node" and name.endswith("_kernel_time") and lo <= e["ts"] <= hi:
                    name = name.removesuffix("_kernel_time")
                    children.append(self.child(name, e.get("args", {}).get("op_name", ""),
                                               t0 + int((e["ts"] - lo) * 1000 * scale),
                                               t0 + int((e["ts"] - lo + e["dur"]) * 1000 * scale), CLOCK,
                                               self._cover_map.get(name)))
        return children


def _shaped(a, meta):
    """`a` in the region's own shape where the exporter's differs only by dims of 1: a 0-d result comes back (1,),
    and a 0-d input it made (1,) carries that on (unsqueeze of one gave (1, 1), not (1,): the value check found it
    in OpInfo's linear_cross_entropy)."""
    if meta is None or a.shape == tuple(meta.shape):
        return a
    return a.reshape(meta.shape) if [d for d in a.shape if d != 1] == [d for d in meta.shape if d != 1] else a


def _onnx():
    """The onnx package, or None (then spans map by their scope names only)."""
    try:
        import onnx
        return onnx
    except ImportError:
        return None


def compile_region(region: Region, desc: Description, chosen: list[str]) -> OrtProgram:
    try:
        return OrtProgram(region, export(region), desc, chosen)
    except Exception as e:       # the exporter or ONNX Runtime may raise anything on a graph it cannot take
        raise StackFailed("onnxruntime", region, e) from e


def load_region(region: Region, blob: bytes, desc: Description, chosen: list[str]) -> OrtProgram:
    """A plan's saved ONNX model for the region. Refused unless it is plain data: every initializer inside
    the model (external data would make ONNX Runtime read a file the plan names) and only the ONNX
    domains torch's exporter writes (a custom domain would ask for a library's kernels)."""
    import onnx
    model = onnx.load_from_string(blob)
    graphs = [model.graph]
    while graphs:                          # the graph and every subgraph (If / Loop bodies) in it
        g = graphs.pop()
        for t in list(g.initializer) + [a.t for n in g.node for a in n.attribute if a.HasField("t")]:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                raise ValueError(f"tensor {t.name[:40]} keeps its values in an external file")
        for n in g.node:
            if n.domain not in ("", "ai.onnx"):
                raise ValueError(f"node {n.name[:40]} is in the custom domain {n.domain[:40]}")
            graphs += [a.g for a in n.attribute if a.HasField("g")] + [x for a in n.attribute for x in a.graphs]
    if len(model.graph.input) != len(region.inputs) or len(model.graph.output) != len(region.outputs):
        raise ValueError(f"the saved model does not have {region.name}'s inputs and outputs")
    return OrtProgram(region, blob, desc, chosen)
