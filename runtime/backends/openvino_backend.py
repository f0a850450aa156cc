"""openvino[:DEVICE]: each region converted by `openvino.convert_model` and compiled for CPU (GPU, NPU, AUTO
where the machine has them).

    opscope run demo:gpt -b openvino               # CPU, float32
    opscope run demo:gpt -b openvino:GPU.0         # an Intel GPU, where there is one

claim: ops with an ATen target in float32/float16/bfloat16/integers -- float64 is refused (OpenVINO computes
it as float32, silently), so those nodes run on the fallback; compile: the region as a torch module
(regions.to_torch) through convert_model, compiled with INFERENCE_PRECISION_HINT from the description
(default f32), then run once on sample inputs against ATen (StackRegistry's tolerance, region_check.py): a
member it computes wrong values for is split off to the fallback like one it cannot compile.
NOTE: on a CPU with bf16 units OpenVINO computes float32 models in bf16 unless that hint is set.
Per-op spans: PERF_COUNT's per-layer times, mapped back through the layers' originalLayersNames.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
import warnings

from ..description import Description
from ..errors import first_line
from ..export_forms import form
from ..hdi import Backend
from ..partition import StackFailed
from ..region_check import REDUCED_PRECISION_TOLERANCE, TOLERANCE
from ..regions import Claim, Region, RegionProgram, example_inputs, to_torch
from ..stack_registry import StackRegistry
from .numpy_backend import NumpyMemory

# NOTE: importing openvino, and each convert_model, reports usage through openvino_telemetry from a process it
# starts per event (24 for one region of demo:gpt; this machine has no network). Without that package OpenVINO
# uses its own stub: opscope hides it from OpenVINO's imports (None in sys.modules makes `import` raise ImportError)
if "openvino" not in sys.modules:
    sys.modules.setdefault("openvino_telemetry", None)

INSTALL = "pip install openvino (or opscope[openvino])"
CLOCK = "openvino PERF_COUNT (per-layer durations, scaled to fit the region's call, laid end to end)"
# its dtypes leave float64 out (aten::diff, which its importer lacks, is exported as its torch form)
_TAKES = Claim()


def claim(node) -> bool | str:
    """_TAKES, less what OpenVINO's importer has no rule for: backward ops and opscope's own (the optimizers),
    except those exported as their torch form (export_forms.py: native_layer_norm, the CPU flash attention and
    the layer-norm, GELU, log-softmax, NLL and embedding backwards)."""
    ok = _TAKES(node)
    name = node.target._schema.name if ok is True else ""
    if ok is True and form(node.target) is None and ("backward" in name or not name.startswith("aten::")):
        return f"{node.op}: OpenVINO's PyTorch importer has no rule for {name}"
    return ok


def device(desc: Description) -> str:
    return desc.options.get("device") or "CPU"


def available(desc: Description) -> tuple[bool, str]:
    try:
        import openvino as ov
    except ImportError:
        return False, f"not installed: {INSTALL}"
    here = ov.Core().available_devices
    want = device(desc)
    # AUTO:NPU,CPU / MULTI:... / HETERO:...: every device listed must be here (AUTO alone picks among them)
    virtual, _, listed = want.partition(":") if want.split(":")[0] in ("AUTO", "MULTI", "HETERO") else ("", "", want)
    for d in filter(None, (x.strip() for x in listed.split(","))):
        if d not in here and not any(h.startswith(d + ".") for h in here):
            return False, (f"device {d} is not on this machine (OpenVINO sees {', '.join(here) or 'none'}); "
                           f"use one of those, e.g. -b openvino:{here[0] if here else 'CPU'}")
    return True, ""


def devices() -> list[str]:
    import openvino as ov
    return list(ov.Core().available_devices)


class OpenVinoBackend(Backend):
    pass


def create(desc: Description, name: str) -> OpenVinoBackend:
    backend = OpenVinoBackend(name=name, description=desc, ops=None, memory=NumpyMemory(),
                              device=f"openvino:{device(desc)}")
    import openvino as ov
    # NOTE: its importer can convert an op to wrong values with no error (aten::copy as its first input did): every
    # region is checked against ATen at compile; f16/bf16 precision (a description's choice) rounds every op, so
    # only a gross error fails there
    tolerance = TOLERANCE if config(desc)["INFERENCE_PRECISION_HINT"] == "f32" else REDUCED_PRECISION_TOLERANCE
    backend.ops = StackRegistry(claim, lambda region: compile_region(region, desc),
                                unsupported=desc.unsupported, supported=desc.supported,
                                load=lambda region, blob: load_region(region, blob, desc),
                                version=f"openvino {ov.__version__}", stack="openvino", tolerance=tolerance)
    return backend


def config(desc: Description, profile: bool = False) -> dict:
    cfg = {"INFERENCE_PRECISION_HINT": desc.options.get("precision", "f32")}
    if desc.options.get("threads"):
        cfg["INFERENCE_NUM_THREADS"] = int(desc.options["threads"])
    if profile:
        cfg["PERF_COUNT"] = "YES"
    return cfg


class OpenVinoProgram(RegionProgram):
    def __init__(self, region: Region, model, desc: Description):
        super().__init__(region, self._run)
        import openvino as ov
        self.core, self.model, self.desc = ov.Core(), model, desc
        self.compiled = self.core.compile_model(model, device(desc), config(desc))
        self.request = self.compiled.create_infer_request()
        self._profiled = None             # a second compiled model with PERF_COUNT, made on first use
        self._active = None

    def artifact(self) -> bytes:
        """The region as OpenVINO IR (xml and weights, full precision), one blob: 8-byte xml length, xml, bin."""
        import openvino as ov
        with tempfile.TemporaryDirectory() as d:
            ov.save_model(self.model, os.path.join(d, "r.xml"), compress_to_fp16=False)
            xml, weights = (open(os.path.join(d, f"r.{x}"), "rb").read() for x in ("xml", "bin"))
        return len(xml).to_bytes(8, "little") + xml + weights

    def _run(self, *inputs):
        request = self._active or self.request
        t0 = time.perf_counter_ns()
        out = request.infer(list(inputs), share_inputs=True)
        self._span = (t0, time.perf_counter_ns())
        return [out[o] for o in request.model_outputs]

    def start_profile(self):
        if self._profiled is None:         # one profiled request per region, kept: PERF_COUNT is per inference
            self._profiled = self.core.compile_model(self.model, device(self.desc), config(self.desc, True))
            self._profiled_request = self._profiled.create_infer_request()
            # NOTE: a request's first inference allocates its memory outside any layer (its layers then summed to
            # 75% of the call); one run here takes that, and is dropped
            self._profiled_request.infer([x.numpy() for x in example_inputs(self.region)])
            self._names = {}
            for op in self._profiled.get_runtime_model().get_ordered_ops():
                info = op.get_rt_info()
                if "originalLayersNames" in info:
                    self._names[op.get_friendly_name()] = info["originalLayersNames"].astype(str).split(",")
        self._active, self._span = self._profiled_request, None

    def stop_profile(self):
        request, self._active = self._active, None
        if request is None or self._span is None:
            return []
        names = self._names
        ran = [p for p in request.get_profiling_info() if p.status.name == "EXECUTED"]
        if not ran:
            # NOTE: OpenVINO folded the whole region to constants (a lone ones_like between a training step's loss
            # and its backward): no layer ran, the call's time is the stack returning them -- the members' own
            return [self.child(f"{self.region.name}/folded", "Constant", *self._span, CLOCK, list(self.region.members))]
        # NOTE: the profile gives durations only, and they add up to more than the call (1.05-1.6x: each layer's
        # time includes waits of its own); cut at the call's end the last layers got 0 ns, so they are scaled
        spans = self.fitted([int(p.real_time.total_seconds() * 1e9) for p in ran], *self._span)
        children = []
        for p, (t0, t1) in zip(ran, spans):
            covered = [m for n in names.get(p.node_name, []) if (m := self.region.member_of_scope(n)) is not None]
            children.append(self.child(p.node_name, p.node_type, t0, t1, CLOCK, covered))
        return children


def compile_region(region: Region, desc: Description) -> OpenVinoProgram:
    import openvino as ov
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")        # the tracer's warnings about constants
            inputs = example_inputs(region)
            # NOTE: static shapes (a region runs at the shapes it was placed for): traced with dynamic ones, a
            # convolution whose weight is a region input (a training step's, or a weight gradient's) fails the CPU
            # plugin, `Doesn't support dynamic weights shape`
            model = ov.convert_model(to_torch(region), example_input=inputs, input=[tuple(x.shape) for x in inputs])
        return OpenVinoProgram(region, model, desc)
    except Exception as e:       # the converter or the plugin may raise anything on a graph it cannot take
        raise StackFailed("openvino", region, e, f"{type(e).__name__}: {_why(e)}") from e


def _why(e: BaseException) -> str:
    """OpenVINO's first line says where a C++ check failed; what failed is its last line (`No conversion rule
    found for operations: aten::trunc`)."""
    lines = [ln.strip(" -") for ln in str(e).splitlines() if ln.strip(" -")]
    return lines[-1] if len(lines) > 1 and lines[0].startswith("Check ") else first_line(e)


def load_region(region: Region, blob: bytes, desc: Description) -> OpenVinoProgram:
    """A plan's saved IR for the region; only OpenVINO's standard opsets (an extension's op would need its
    library, which opscope never loads), with the region's inputs and outputs."""
    import numpy as np
    import openvino as ov
    n = int.from_bytes(blob[:8], "little")
    if not 0 < n <= len(blob) - 8:
        raise ValueError("the saved IR's length prefix is out of range")
    model = ov.Core().read_model(model=blob[8:8 + n].decode("utf-8"),
                                 weights=ov.Tensor(np.frombuffer(blob, np.uint8, offset=8 + n).copy()))
    for op in model.get_ordered_ops():
        if not op.get_type_info().version_id.startswith("opset"):
            raise ValueError(f"op {op.get_type_info().name[:40]} is not from an OpenVINO opset")
    if len(model.inputs) != len(region.inputs) or len(model.outputs) != len(region.outputs):
        raise ValueError(f"the saved IR does not have {region.name}'s inputs and outputs")
    return OpenVinoProgram(region, model, desc)
