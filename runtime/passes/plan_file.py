"""Saved execution plans (`.opsplan`): the optimized, placed graph, so a run skips capture and passes.

    info = save_plan("gpt.opsplan", plan, model=m, inputs=x, model_spec="demo:gpt", backend_spec="sim:npu-a1")
    loaded = load_plan("gpt.opsplan", model=m, inputs=x)          # refuses a stale or foreign plan (UsageError)
    loaded.executor.run(*x); loaded.info["startup_seconds"], loaded.info["saved_seconds"]

Format (version 1) -- a zip archive, never a pickle:

    plan.json         one JSON document (below)
    plan.sha256       hex SHA-256 of plan.json: a corrupted or edited plan is refused
    constants/N.npy   constant slot N (values the passes made, optimizer state), numpy .npy, no pickles

plan.json: {"format": "opscope-plan", "version": 1, "model": spec, "fingerprint": {class, state (hash of
parameter names, shapes and dtypes), inputs}, "backend": {spec, name, digest (of its description)},
"versions": {opscope, torch}, "passes", "pass_log", "placement": [[node, backend]], "graph": {nodes,
num_slots, input_slots, output_refs, slot_meta, constants: {slot: {"param": name} | {"file": path} | null}},
"carry", "train", "timing": {capture_seconds, compile_seconds}, "memory_plan"}.
Values in args/attrs are JSON, with tagged objects for what JSON lacks: {"$ref": slot}, {"$tuple": [...]},
{"$dict": [[k, v], ...]}, {"$float": "nan"|"inf"|"-inf"}, {"$dtype": name}, {"$device": str},
{"$torch": "channels_last"|"strided"|...}, {"$node": node} (a fused node's members).
Weights are not copied: constants that are the model's parameters or buffers are named, and MODEL
supplies them when the plan is loaded (after checking it is the same model).
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import re
import time
import zipfile
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import UsageError, first_line
from ..graph import Graph, Node, Ref, TensorMeta

FORMAT, VERSION = "opscope-plan", 1
MAX_JSON = 256 << 20
MAX_INLINE = 2 << 30          # the values a plan holds itself (folded constants; weights are only named)
_CONST_NAME = re.compile(r"^constants/\d+\.npy$")


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    try:
        mine = version("opscope")
    except PackageNotFoundError:
        mine = "0+unknown"
    return {"opscope": mine, "torch": torch.__version__}


def fingerprint(model, inputs) -> dict:
    """What makes two models the same for a plan: class, parameter names/shapes/dtypes, input shapes."""
    state = sorted((k, list(v.shape), str(v.dtype)) for k, v in model.state_dict().items())
    return {"class": type(model).__qualname__,
            "state": hashlib.sha256(json.dumps(state).encode()).hexdigest()[:16],
            "inputs": [[list(x.shape), str(x.dtype)] if isinstance(x, torch.Tensor) else repr(x) for x in inputs]}


# --- values ------------------------------------------------------------------------------
_TORCH_OBJS = {str(o).replace("torch.", ""): o for o in (torch.channels_last, torch.contiguous_format,
                                                          torch.preserve_format, torch.strided,
                                                          torch.channels_last_3d, torch.sparse_coo)}


def _enc(v):
    if isinstance(v, Ref):
        return {"$ref": v.slot}
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"$float": repr(v)}
    if isinstance(v, tuple):
        return {"$tuple": [_enc(x) for x in v]}
    if isinstance(v, list):
        return [_enc(x) for x in v]
    if isinstance(v, dict):
        return {"$dict": [[str(k), _enc(x)] for k, x in v.items()]}
    if isinstance(v, torch.dtype):
        from ..dtypes import name_of
        return {"$dtype": name_of(v)}
    if isinstance(v, torch.device):
        return {"$device": str(v)}
    if isinstance(v, Node):
        return {"$node": _enc_node(v)}
    key = str(v).replace("torch.", "")
    if key in _TORCH_OBJS:
        return {"$torch": key}
    raise UsageError(f"cannot save a plan holding a {type(v).__name__} ({first_line(repr(v))[:60]}); "
                     "run the model without --plan")


def _dec(v):
    if isinstance(v, list):
        return [_dec(x) for x in v]
    if not isinstance(v, dict):
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        raise ValueError(f"unexpected value {v!r}")
    if len(v) != 1:
        raise ValueError("a tagged value has exactly one key")
    (tag, x), = v.items()
    if tag == "$ref":
        if not isinstance(x, int) or isinstance(x, bool) or x < 0:
            raise ValueError("bad slot")
        return Ref(x)
    if tag == "$tuple":
        return tuple(_dec(list(x)))
    if tag == "$dict":
        return {str(k): _dec(y) for k, y in x}
    if tag == "$float":
        return float({"nan": "nan", "inf": "inf", "-inf": "-inf"}[x])
    if tag == "$dtype":
        from ..dtypes import to_torch
        return to_torch(x)
    if tag == "$device":
        return torch.device(str(x))
    if tag == "$torch":
        return _TORCH_OBJS[x]
    if tag == "$node":
        return _dec_node(x)
    raise ValueError(f"unknown tag {tag!r}")


def _meta(m):
    return None if m is None else [list(m.shape), m.dtype]


def _unmeta(x):
    if x is None:
        return None
    shape, dtype = x
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape) or not isinstance(dtype, str):
        raise ValueError("bad tensor metadata")
    return TensorMeta(tuple(shape), dtype)


# --- targets -----------------------------------------------------------------------------
def _target_name(node: Node):
    from .fuse import FusedCall
    from .layout import LayoutCall, relayout_torch
    t = node.target
    if t is None or isinstance(t, FusedCall):
        return None if t is None else "$fused"
    if t is relayout_torch:
        return "$relayout"
    if isinstance(t, LayoutCall):
        return {"$nhwc": _op_name(t.kernel, node)}
    return _op_name(t, node)


def _op_name(t, node):
    if isinstance(t, torch._ops.OpOverload):
        return f"{t._schema.name}.{t._overloadname}"
    raise UsageError(f"cannot save node {node.name}: its kernel {first_line(repr(t))[:60]} is not a torch op")


def _target(name, node: Node):
    from .fuse import FusedCall
    from .layout import LayoutCall, relayout_torch
    if name is None:
        return None
    if name == "$fused":
        return FusedCall(node)
    if name == "$relayout":
        return relayout_torch
    if isinstance(name, dict):
        return LayoutCall(_target(name["$nhwc"], node), node.attrs["nhwc_args"])
    qual, _, overload = name.rpartition(".")
    ns, _, op = qual.partition("::")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


def _enc_node(n: Node) -> dict:
    return {"name": n.name, "op": n.op, "target": _target_name(n), "args": _enc(tuple(n.args)),
            "kwargs": _enc(dict(n.kwargs)), "inputs": list(n.inputs), "outputs": list(n.outputs),
            "input_meta": [_meta(m) for m in n.input_meta], "output_meta": [_meta(m) for m in n.output_meta],
            "attrs": _enc(dict(n.attrs)), "module_path": n.module_path, "module_type": n.module_type,
            "source": n.source, "source_line": n.source_line, "multi_output": bool(n.multi_output)}


def _dec_node(d: dict, index: int = -1) -> Node:
    n = Node(index=index, name=str(d["name"]), op=str(d["op"]), target=None, args=tuple(_dec(d["args"])),
             kwargs=dict(_dec(d["kwargs"])), inputs=[int(s) for s in d["inputs"]],
             outputs=[int(s) for s in d["outputs"]], input_meta=[_unmeta(m) for m in d["input_meta"]],
             output_meta=[_unmeta(m) for m in d["output_meta"]], attrs=dict(_dec(d["attrs"])),
             module_path=str(d["module_path"]), module_type=str(d["module_type"]), source=str(d["source"]),
             source_line=str(d["source_line"]), multi_output=bool(d["multi_output"]))
    n.target = _target(d["target"], n)
    return n


# --- save --------------------------------------------------------------------------------
def save_plan(path, plan, *, model, inputs, model_spec: str, backend_spec: str, train: bool = False,
              timing: dict | None = None) -> dict:
    """Write `plan` (from compile_plan on `model` captured with `inputs`) to `path`; returns plan.json's summary."""
    g = plan.graph
    used = {s for n in g.nodes for s in n.inputs if s in g.constant_slots}
    names = {}
    for k, t in list(model.state_dict(keep_vars=True).items()):
        t = t.detach()
        if t.numel():
            names.setdefault((t.data_ptr(), tuple(t.shape), t.dtype, tuple(t.stride())), k)
    consts, files = {}, {}
    for s, t in g.constant_slots.items():
        if s not in used or t is None:
            consts[str(s)] = None
            continue
        key = (t.data_ptr(), tuple(t.shape), t.dtype, tuple(t.stride())) if t.numel() else None
        if key in names and s not in plan.carry:
            consts[str(s)] = {"param": names[key]}
        else:
            name = f"constants/{s}.npy"
            consts[str(s)] = {"file": name, "dtype": str(t.dtype).replace("torch.", "")}
            buf = io.BytesIO()
            host = t.detach().cpu().contiguous()
            np.save(buf, (host.view(torch.int16) if host.dtype == torch.bfloat16 else host).numpy(),
                    allow_pickle=False)
            files[name] = buf.getvalue()
    doc = {
        "format": FORMAT, "version": VERSION, "model": model_spec, "fingerprint": fingerprint(model, inputs),
        "backend": {"spec": backend_spec, "name": plan.backend.name, "digest": plan.backend.description.digest},
        "versions": versions(), "passes": list(plan.passes), "pass_log": plan.pass_log,
        "placement": [[n.name, b.name] for n, b in plan.placement.assignments],
        "graph": {"nodes": [_enc_node(n) for n in g.nodes], "num_slots": g.num_slots,
                  "input_slots": list(g.input_slots), "output_refs": _enc(list(g.output_refs)),
                  "slot_meta": [[s, _meta(m)] for s, m in sorted(g.slot_meta.items())], "constants": consts,
                  "model_name": g.model_name},
        "carry": [[c, o] for c, o in plan.carry.items()], "train": bool(train), "timing": dict(timing or {}),
        "memory_plan": plan.memory_plan,
    }
    body = json.dumps(doc, allow_nan=False).encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("plan.json", body)
        z.writestr("plan.sha256", hashlib.sha256(body).hexdigest())
        for name, data in files.items():
            z.writestr(name, data)
    return {k: doc[k] for k in ("format", "version", "model", "backend", "versions", "passes", "timing",
                                "memory_plan")} | {"nodes": len(g.nodes), "bytes_inline": sum(map(len, files.values()))}


# --- load --------------------------------------------------------------------------------
@dataclass
class LoadedPlan:
    plan: object
    executor: object
    info: dict


def read_plan(path) -> tuple[dict, dict]:
    """(plan.json as a dict, {constant file name: bytes}); UsageError for anything that is not a valid plan."""
    where = f"plan {path}"
    try:
        with zipfile.ZipFile(path) as z:
            members = {i.filename: i for i in z.infolist()}
            if "plan.json" not in members or "plan.sha256" not in members:
                raise UsageError(f"{where}: not an opscope plan (no plan.json); make one with `opscope compile`")
            if members["plan.json"].file_size > MAX_JSON:
                raise UsageError(f"{where}: plan.json is larger than {MAX_JSON} bytes")
            if members["plan.sha256"].file_size > 128:
                raise UsageError(f"{where}: corrupted (plan.sha256 is not a checksum); compile it again")
            inline = sum(i.file_size for n, i in members.items() if _CONST_NAME.match(n))
            if inline > MAX_INLINE:      # a zip's sizes bound what reading it decompresses
                raise UsageError(f"{where}: holds {inline} bytes of values, over the {MAX_INLINE}-byte limit")
            body = z.read("plan.json")
            digest = z.read("plan.sha256").decode("ascii", "replace").strip()
            files = {n: z.read(n) for n in members if _CONST_NAME.match(n)}
    except UsageError:
        raise
    except FileNotFoundError:
        raise UsageError(f"{where} does not exist: make one with `opscope compile MODEL -b BACKEND -o FILE`") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError,
            RuntimeError, KeyError) as e:
        raise UsageError(f"{where}: corrupted or truncated ({type(e).__name__}: {first_line(e)[:80]}); "
                         "compile it again") from None
    except Exception as e:     # zlib and friends raise their own errors on damaged archives
        raise UsageError(f"{where}: corrupted or truncated ({type(e).__name__}); compile it again") from None
    if hashlib.sha256(body).hexdigest() != digest:
        raise UsageError(f"{where}: corrupted (its checksum does not match its contents); compile it again")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise UsageError(f"{where}: corrupted (plan.json is not JSON); compile it again") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise UsageError(f"{where}: not an opscope plan; make one with `opscope compile`")
    if doc.get("version") != VERSION:
        raise UsageError(f"{where}: plan format version {doc.get('version')!r}, this opscope reads {VERSION}; "
                         "compile it again")
    return doc, files


def check_plan(doc: dict, path, *, model=None, inputs=None, backend=None) -> None:
    """Refuse a plan made for another model, backend, description or software version (one line each)."""
    where = f"plan {path}"
    b = doc.get("backend") or {}
    if backend is not None and b.get("name") != backend.name:
        raise UsageError(f"{where} is for backend {b.get('name')}, not {backend.name}: compile one for "
                         f"{backend.name} or run with -b {b.get('spec')}")
    if backend is not None and b.get("digest") != backend.description.digest:
        raise UsageError(f"{where}: the description of {backend.name} changed since the plan was compiled "
                         f"({b.get('digest') or 'none'} -> {backend.description.digest or 'none'}); "
                         "recompile it (--recompile)")
    now = versions()
    if doc.get("versions") != now:
        was = doc.get("versions") or {}
        raise UsageError(f"{where} was compiled with opscope {was.get('opscope')} / torch {was.get('torch')}, "
                         f"this is opscope {now['opscope']} / torch {now['torch']}: recompile it (--recompile)")
    if model is not None and doc.get("fingerprint") != fingerprint(model, inputs):
        fp = doc.get("fingerprint") or {}
        raise UsageError(f"{where} was compiled for another model or input shapes ({fp.get('class')}, inputs "
                         f"{fp.get('inputs')}): compile one for this model")


def decode_graph(doc: dict, files: dict, model) -> tuple[Graph, dict]:
    g = doc["graph"]
    state = {k: v.detach() for k, v in model.state_dict().items()} if model is not None else {}
    constants = {}
    for s, c in g["constants"].items():
        if c is None:
            constants[int(s)] = None
        elif "param" in c:
            if c["param"] not in state:
                raise UsageError(f"the plan reads parameter {c['param']!r}, which the model does not have")
            constants[int(s)] = state[c["param"]]
        else:
            arr = np.load(io.BytesIO(files[c["file"]]), allow_pickle=False)
            t = torch.from_numpy(np.array(arr))
            constants[int(s)] = t.view(torch.bfloat16) if c.get("dtype") == "bfloat16" else t
    nodes = [_dec_node(d, i) for i, d in enumerate(g["nodes"])]
    graph = Graph(nodes=nodes, num_slots=int(g["num_slots"]), input_slots=[int(s) for s in g["input_slots"]],
                  constant_slots=constants, output_refs=_dec(g["output_refs"]),
                  slot_meta={int(s): _unmeta(m) for s, m in g["slot_meta"]}, model_name=str(g["model_name"]))
    if graph.num_slots > 1 << 31 or any(s >= graph.num_slots or s < 0 for n in nodes for s in n.inputs + n.outputs):
        raise ValueError("a node reads or writes a slot outside the graph")
    return graph, {int(c): int(o) for c, o in doc["carry"]}


def load_plan(path, *, model, inputs, backend=None) -> LoadedPlan:
    """Read, check and bind a plan; `backend` defaults to the plan's own (resolved from its spec)."""
    from .. import backends as _backends
    from ..executor import Executor, apply_memory_plan, compile_plan
    from . import fuse, layout  # noqa: F401 -- their ops (fused, relayout) must be registered
    t0 = time.perf_counter()
    doc, files = read_plan(path)
    try:
        spec = str(doc["backend"]["spec"])
    except (KeyError, TypeError):
        raise UsageError(f"plan {path}: corrupted (no backend); compile it again") from None
    backend = backend or _backends.resolve(spec)
    check_plan(doc, path, model=model, inputs=inputs, backend=backend)
    try:
        graph, carry = decode_graph(doc, files, model)
        plan = compile_plan(graph, backend, carry=carry, passes=[])
        placed = [[n.name, b.name] for n, b in plan.placement.assignments]
        if placed != doc["placement"]:
            raise UsageError(f"plan {path}: {backend.name} now places the graph differently than when it was "
                             "compiled: recompile it (--recompile)")
        plan.passes, plan.pass_log = list(doc["passes"]), list(doc["pass_log"])
        if "memplan" in plan.passes:
            apply_memory_plan(plan)
    except UsageError:
        raise
    except Exception as e:        # a plan.json with a valid checksum but a shape we do not read
        raise UsageError(f"plan {path}: not a plan this opscope can read ({type(e).__name__}: "
                         f"{first_line(e)[:80]}); compile it again") from None
    startup = time.perf_counter() - t0
    timing = doc.get("timing") or {}
    before = float(timing.get("capture_seconds", 0.0)) + float(timing.get("compile_seconds", 0.0))
    info = {"path": str(path), "backend": backend.name, "passes": plan.passes, "train": bool(doc.get("train")),
            "startup_seconds": startup, "capture_seconds": before, "saved_seconds": before - startup,
            "memory_plan": plan.memory_plan}
    return LoadedPlan(plan, Executor(plan), info)


def open_plan_session(path, model_spec: str, backend_spec: str | None = None, *, recompile: bool = False):
    """A runtime Session from a plan file (what `opscope run MODEL --plan FILE` does): MODEL gives the
    inputs and weights; `backend_spec`, when given, must be the plan's. `recompile`: a stale plan
    (description or versions changed) is compiled again with the same passes and rewritten."""
    from .. import backends as _backends, models
    from ..session import Session
    doc, _ = read_plan(path)
    model, inputs = (models.load_train if doc.get("train") else models.load)(model_spec)
    backend = _backends.resolve(backend_spec) if backend_spec else None
    try:
        loaded = load_plan(path, model=model, inputs=inputs, backend=backend)
    except UsageError as e:
        if not recompile or "recompile" not in str(e):
            raise
        compile_to_file(path, model_spec, backend_spec or doc["backend"]["spec"], passes=doc["passes"],
                        train=bool(doc.get("train")))
        loaded = load_plan(path, model=model, inputs=inputs, backend=backend)
        loaded.info["recompiled"] = True
    s = Session(model_spec, model, inputs, loaded.plan.graph, loaded.plan.backend, loaded.plan, loaded.executor,
                loaded.info["startup_seconds"])
    s.extra["plan"] = loaded.info
    return s


def compile_to_file(path, model_spec: str, backend_spec: str, *, passes=None, train: bool = False,
                    allow_fallback: bool = True, optimizer=None) -> dict:
    """Capture, run the passes, place, save: `opscope compile`. `passes` None: every pass the
    description does not switch off."""
    from .. import backends as _backends, models
    from ..capture import capture
    from ..executor import compile_plan
    from . import described, pass_names
    backend = _backends.resolve(backend_spec)
    names = pass_names(passes) if passes is not None else described(backend.description, default=True)
    t0 = time.perf_counter()
    carry = None
    if train:
        from ..train.step import OptimizerSpec, build_train_graph
        from ..train.joint import capture_joint
        model, inputs = models.load_train(model_spec)
        tg = build_train_graph(capture_joint(model, inputs, model_spec), optimizer or OptimizerSpec())
        graph, carry = tg.graph, tg.carry
    else:
        model, inputs = models.load(model_spec)
        graph = capture(model, inputs, name=model_spec)
    t1 = time.perf_counter()
    plan = compile_plan(graph, backend, allow_fallback=allow_fallback, carry=carry, passes=names)
    t2 = time.perf_counter()
    info = save_plan(path, plan, model=model, inputs=inputs, model_spec=model_spec, backend_spec=backend_spec,
                     train=train, timing={"capture_seconds": t1 - t0, "compile_seconds": t2 - t1})
    info["pass_log"] = plan.pass_log
    info["path"] = str(path)
    return info
