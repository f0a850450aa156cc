"""Saved execution plans (`.opsplan`): the optimized, placed graph, so a run skips capture and passes.

    info = save_plan("gpt.opsplan", plan, model=m, inputs=x, model_spec="demo:gpt", backend_spec="sim:npu-a1")
    loaded = load_plan("gpt.opsplan", model=m, inputs=x)          # refuses a stale or foreign plan (UsageError)
    loaded.executor.run(*x); loaded.info["startup_seconds"], loaded.info["saved_seconds"]

Format (version 1) -- a zip archive starting at byte 0, never a pickle:

    plan.json         one JSON document (below)
    plan.sha256       hex SHA-256 of plan.json: a plan damaged by accident is refused
    plan.sig          optional: an Ed25519 signature of every other member (plan_sign.py; --sign / --trust)
    constants/N.npy   constant slot N (values the passes made, optimizer state), numpy .npy, no pickles
    regions/regionN.bin  a compiler stack's compiled region (ONNX model, OpenVINO IR, serialized
                      StableHLO): run --plan loads it instead of compiling (plan_regions.py)

plan.json: {"format": "opscope-plan", "version": 1, "model": spec, "fingerprint": {class, state (hash of
parameter names, shapes and dtypes), inputs}, "backend": {spec, name, digest (of its description)},
"versions": {opscope, torch}, "passes", "pass_log", "placement": [[node, backend]], "graph": {nodes,
num_slots, input_slots, output_refs, slot_meta, constants: {slot: {"param": name} | {"file": path} | null}},
"carry", "train", "timing": {capture_seconds, compile_seconds}, "memory_plan", "regions", "splits": [{node,
reason}] (members a stack failed inside a region: they stay on the fallback when the plan is loaded)}.
Values in args/attrs are JSON, with tagged objects for what JSON lacks: {"$ref": slot}, {"$tuple": [...]},
{"$dict": [[k, v], ...]}, {"$float": "nan"|"inf"|"-inf"}, {"$dtype": name}, {"$device": str},
{"$torch": "channels_last"|"strided"|...}, {"$node": node} (a fused node's members).
Weights are not copied: constants that are the model's parameters or buffers are named, and MODEL
supplies them when the plan is loaded (after checking it is the same model).

What a plan someone sent you can do, signed or not: compute the ops it names, on the model and inputs
YOU give, on a backend you give (-b) or one it names among numpy, torch:DEVICE and the sim:NAME
descriptions you have -- nothing else. A node's kernel is a name looked up in a fixed table of opscope's
ops (plan_targets.py), never an attribute path or a module; a plan never names a description file or
an implementation module; every member is read with a size and compression-ratio bound (plan_archive.py),
constants and slot counts are checked against what the plan declares before anything is allocated.
What an unsigned plan cannot tell you is who made it: plan.sha256 is recomputed by anyone who edits
the plan. `--trust KEYS` runs only plans signed by one of KEYS, unchanged since.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import time
import zipfile
from dataclasses import dataclass

import numpy as np
import torch

from ..dtypes import ITEMSIZE
from ..errors import UsageError, first_line
from ..graph import Graph, Node, Ref, TensorMeta
from . import plan_regions, plan_sign
from .plan_archive import PlanArchive
from .plan_targets import kernel_for, target_name

FORMAT, VERSION = "opscope-plan", 1
MAX_JSON = 32 << 20           # ~900 bytes a node: 35,000 nodes; json.loads of it stays under a GiB
MAX_INLINE = 2 << 30          # the values a plan holds itself (folded constants; weights are only named)
MAX_SLOTS = 1 << 24           # the executor holds a list of this many values
MAX_DIMS, MAX_DIM = 64, 1 << 48
NPY_HEADER = 1 << 16          # what numpy allows a .npy header to take beyond the values
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


def _dec(v, where="plan"):
    if isinstance(v, list):
        return [_dec(x, where) for x in v]
    if not isinstance(v, dict):
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        raise ValueError(f"unexpected value {v!r}")
    if len(v) != 1:
        raise ValueError("a tagged value has exactly one key")
    (tag, x), = v.items()
    if tag == "$ref":
        return Ref(_slot(x))
    if tag == "$tuple" and isinstance(x, list):
        return tuple(_dec(x, where))
    if tag == "$dict" and isinstance(x, list):
        return {_str(k): _dec(y, where) for k, y in x}
    if tag == "$float":
        return float({"nan": "nan", "inf": "inf", "-inf": "-inf"}[x])
    if tag == "$dtype" and x in ITEMSIZE:
        from ..dtypes import to_torch
        return to_torch(x)
    if tag == "$device" and isinstance(x, str) and len(x) <= 64:
        return torch.device(x)
    if tag == "$torch":
        return _TORCH_OBJS[x]
    if tag == "$node" and isinstance(x, dict):
        return _dec_node(x, where=where)
    raise ValueError(f"unknown tag {ascii(tag)[:40]} or a bad value for it")


def _slot(x) -> int:
    if type(x) is not int or not 0 <= x < MAX_SLOTS:
        raise ValueError(f"bad slot {ascii(x)[:40]}")
    return x


def _str(x) -> str:
    if not isinstance(x, str):
        raise ValueError(f"expected a string, got {type(x).__name__}")
    return x


def _meta(m):
    return None if m is None else [list(m.shape), m.dtype]


def _unmeta(x):
    if x is None:
        return None
    shape, dtype = x
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or dtype not in ITEMSIZE or \
            not all(type(d) is int and 0 <= d <= MAX_DIM for d in shape):
        raise ValueError("bad tensor metadata")
    return TensorMeta(tuple(shape), dtype)


def _enc_node(n: Node) -> dict:
    return {"name": n.name, "op": n.op, "target": target_name(n), "args": _enc(tuple(n.args)),
            "kwargs": _enc(dict(n.kwargs)), "inputs": list(n.inputs), "outputs": list(n.outputs),
            "input_meta": [_meta(m) for m in n.input_meta], "output_meta": [_meta(m) for m in n.output_meta],
            "attrs": _enc(dict(n.attrs)), "module_path": n.module_path, "module_type": n.module_type,
            "source": n.source, "source_line": n.source_line, "multi_output": bool(n.multi_output)}


def _dec_node(d: dict, index: int = -1, where: str = "plan") -> Node:
    n = Node(index=index, name=_str(d["name"]), op=_str(d["op"]), target=None, args=tuple(_dec(d["args"], where)),
             kwargs=dict(_dec(d["kwargs"], where)), inputs=[_slot(s) for s in d["inputs"]],
             outputs=[_slot(s) for s in d["outputs"]], input_meta=[_unmeta(m) for m in d["input_meta"]],
             output_meta=[_unmeta(m) for m in d["output_meta"]], attrs=dict(_dec(d["attrs"], where)),
             module_path=_str(d["module_path"]), module_type=_str(d["module_type"]), source=_str(d["source"]),
             source_line=_str(d["source_line"]), multi_output=bool(d["multi_output"]))
    n.target = kernel_for(d["target"], n, where)       # a table lookup: UsageError naming the node
    return n


# --- save --------------------------------------------------------------------------------
def save_plan(path, plan, *, model, inputs, model_spec: str, backend_spec: str, train: bool = False,
              timing: dict | None = None, sign_key=None) -> dict:
    """Write `plan` (from compile_plan on `model` captured with `inputs`) to `path`; returns plan.json's summary.
    `sign_key` (plan_sign.load_signing_key): add plan.sig, a signature of every member."""
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
    from .. import autoplace
    if autoplace.is_auto(plan.backend.name):                    # -b auto: what its search chose, placed again on load
        doc["auto"] = autoplace.plan_entry(plan)
    doc["regions"], programs = plan_regions.collect(plan)      # a stack's compiled regions, when it has them
    doc["splits"] = plan_regions.splits(plan)                  # and the members it failed inside them
    files.update(programs)
    body = json.dumps(doc, allow_nan=False).encode()
    members = {"plan.json": body, "plan.sha256": hashlib.sha256(body).hexdigest().encode(), **files}
    if sign_key is not None:
        members[plan_sign.SIG_MEMBER] = plan_sign.sign(members, sign_key)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return {k: doc[k] for k in ("format", "version", "model", "backend", "versions", "passes", "timing",
                                "memory_plan")} | {"nodes": len(g.nodes), "bytes_inline": sum(map(len, files.values()))}


# --- load --------------------------------------------------------------------------------
@dataclass
class LoadedPlan:
    plan: object
    executor: object
    info: dict


def read_plan(path, trust: dict | None = None) -> tuple[dict, dict]:
    """(plan.json as a dict, {constant file name: bytes}); UsageError for anything that is not a valid plan.
    `trust` (plan_sign.load_trusted_keys): refuse unless one of these keys signed every member."""
    where = f"plan {path}"
    with PlanArchive.open(path, where) as a:
        if "plan.json" not in a.infos or "plan.sha256" not in a.infos:
            raise UsageError(f"{where}: not an opscope plan (no plan.json); make one with `opscope compile`")
        if a.size("plan.json") > MAX_JSON:
            raise UsageError(f"{where}: plan.json is larger than {MAX_JSON} bytes")
        if a.size("plan.sha256") > 128:
            raise UsageError(f"{where}: corrupted (plan.sha256 is not a checksum); compile it again")
        body, digest = a.read("plan.json", MAX_JSON), a.read("plan.sha256", 128)
        signature = a.read(plan_sign.SIG_MEMBER, plan_sign.MAX_SIG) if plan_sign.SIG_MEMBER in a.infos else None
        signed, names = None, set(a.names)
        if trust is not None:          # checked before a byte of plan.json is parsed
            signed, _ = plan_sign.signed_digests(signature, trust, where)
            plan_sign.check_digests(signed, {"plan.json": body, "plan.sha256": digest}, where, names)
        if hashlib.sha256(body).hexdigest() != digest.decode("ascii", "replace").strip():
            raise UsageError(f"{where}: corrupted (its checksum does not match its contents); compile it again")
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            raise UsageError(f"{where}: corrupted (plan.json is not JSON); compile it again") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise UsageError(f"{where}: not an opscope plan; make one with `opscope compile`")
        if doc.get("version") != VERSION:
            raise UsageError(f"{where}: plan format version {ascii(doc.get('version'))[:20]}, this opscope reads "
                             f"{VERSION}; compile it again")
        # Each constant member is bounded by the size the plan declares for it, and all of them together
        # by MAX_INLINE, before a byte of it is inflated.
        declared = _declared_constants(doc, where)
        for name in a.names:
            if _CONST_NAME.match(name) and name not in declared:
                raise UsageError(f"{where}: holds {name}, which its plan.json does not name; compile it again")
        regions = plan_regions.declared(doc, where)
        for name in a.names:
            if name.startswith("regions/") and name not in {r["file"] for r in regions}:
                raise UsageError(f"{where}: holds {name}, which its plan.json does not name; compile it again")
        total = sum(nbytes for _, nbytes in declared.values()) + sum(r["bytes"] for r in regions)
        if total > MAX_INLINE:
            raise UsageError(f"{where}: declares {total} bytes of values, over the {MAX_INLINE}-byte limit")
        files = {}
        for name, (_, nbytes) in declared.items():
            if name not in a.infos:
                raise UsageError(f"{where}: names {name}, which it does not hold; compile it again")
            files[name] = a.read(name, nbytes + NPY_HEADER)
        for r in regions:
            if r["file"] not in a.infos:
                raise UsageError(f"{where}: names {r['file']}, which it does not hold; compile it again")
            files[r["file"]] = a.read(r["file"], r["bytes"])
            plan_regions.check_bytes(r, files[r["file"]], where)
    if signed is not None:
        plan_sign.check_digests(signed, files, where, names)
    return doc, files


def _declared_constants(doc: dict, where: str) -> dict[str, tuple[TensorMeta, int]]:
    """constants/N.npy -> (the slot's declared meta, its bytes) for every constant the plan holds itself."""
    try:
        g = doc["graph"]
        meta = {_slot(s): _unmeta(m) for s, m in g["slot_meta"]}
        out = {}
        for s, c in g["constants"].items():
            if isinstance(c, dict) and "file" in c:
                m = meta[int(s)]
                if c["file"] != f"constants/{int(s)}.npy" or m is None:
                    raise ValueError(f"constant {ascii(s)[:20]}")
                out[c["file"]] = (m, m.nbytes)
        return out
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UsageError(f"{where}: not a plan this opscope can read (its constants: {type(e).__name__}: "
                         f"{first_line(e)[:60]}); compile it again") from None


def _constant(data: bytes, meta: TensorMeta, dtype, where: str, name: str) -> torch.Tensor:
    """A .npy member whose header says exactly the shape and dtype the plan declares for its slot."""
    f = io.BytesIO(data)
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dt = read(f)
    want = "int16" if dtype == "bfloat16" else dtype
    if dt.hasobject or dt.name != want or tuple(shape) != tuple(meta.shape) or meta.dtype != dtype:
        raise UsageError(f"{where}: {name} holds {dt.name}{list(shape)}, not the {meta.dtype}{list(meta.shape)} "
                         "the plan declares; compile it again")
    t = torch.from_numpy(np.array(np.load(io.BytesIO(data), allow_pickle=False)))
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


def check_plan(doc: dict, path, *, model=None, inputs=None, backend=None) -> None:
    """Refuse a plan made for another model, backend, description or software version (one line each)."""
    where = f"plan {path}"
    b = doc.get("backend") if isinstance(doc.get("backend"), dict) else {}
    if backend is not None and b.get("name") != backend.name:
        raise UsageError(f"{where} is for backend {_shown(b.get('name'))}, not {backend.name}: compile one for "
                         f"{backend.name} or run with -b {_shown(b.get('spec'))}")
    if backend is not None and b.get("digest") != backend.description.digest:
        raise UsageError(f"{where}: the description of {backend.name} changed since the plan was compiled "
                         f"({_shown(b.get('digest') or 'none')} -> {backend.description.digest or 'none'}); "
                         "recompile it (--recompile)")
    now = versions()
    if doc.get("versions") != now:
        was = doc.get("versions") if isinstance(doc.get("versions"), dict) else {}
        raise UsageError(f"{where} was compiled with opscope {_shown(was.get('opscope'))} / torch "
                         f"{_shown(was.get('torch'))}, this is opscope {now['opscope']} / torch {now['torch']}: "
                         "recompile it (--recompile)")
    if model is not None and doc.get("fingerprint") != fingerprint(model, inputs):
        fp = doc.get("fingerprint") if isinstance(doc.get("fingerprint"), dict) else {}
        raise UsageError(f"{where} was compiled for another model or input shapes ({_shown(fp.get('class'))}, "
                         f"inputs {_shown(fp.get('inputs'))}): compile one for this model")


def _shown(v, limit: int = 80) -> str:
    """A value from a plan inside a one-line message: printable and short, as it is, else escaped."""
    text = str(v)
    return text if text.isprintable() and len(text) <= limit else ascii(text)[:limit]


def _spec_shown(spec) -> str:
    """A plan's backend spec where the message says `pass -b SPEC`: a description file's path in full
    (PATH_MAX), else the user cannot copy it (80 characters cut a CI tmp path before its chip.toml)."""
    return _shown(spec, 4096)


def decode_graph(doc: dict, files: dict, model, where: str = "plan") -> tuple[Graph, dict]:
    g = doc["graph"]
    state = {k: v.detach() for k, v in model.state_dict().items()} if model is not None else {}
    slot_meta = {_slot(s): _unmeta(m) for s, m in g["slot_meta"]}
    constants = {}
    for s, c in g["constants"].items():
        if c is None:
            constants[_slot(int(s))] = None
        elif "param" in c:
            if c["param"] not in state:
                raise UsageError(f"{where} reads parameter {ascii(c['param'])[:60]}, which the model does not have")
            constants[_slot(int(s))] = state[c["param"]]
        else:
            slot = _slot(int(s))
            constants[slot] = _constant(files[c["file"]], slot_meta[slot], c.get("dtype"), where, c["file"])
    nodes = [_dec_node(d, i, where) for i, d in enumerate(g["nodes"])]
    num_slots = g["num_slots"]
    # The executor holds num_slots values: the count must be one the plan's own slots account for.
    written = sum(len(m.outputs) for n in nodes for m in [n, *n.attrs.get("members", ())] if isinstance(m, Node))
    declared = len(slot_meta) + len(constants) + len(g["input_slots"]) + written
    if type(num_slots) is not int or not 0 <= num_slots <= min(declared, MAX_SLOTS):
        raise UsageError(f"{where}: num_slots {ascii(num_slots)[:40]} is not the {declared} slots or fewer it "
                         "declares; compile it again")
    graph = Graph(nodes=nodes, num_slots=num_slots, input_slots=[_slot(s) for s in g["input_slots"]],
                  constant_slots=constants, output_refs=_dec(g["output_refs"], where), slot_meta=slot_meta,
                  model_name=_str(g["model_name"]))
    used = [*graph.input_slots, *constants, *slot_meta, *(s for n in nodes for s in n.inputs + n.outputs)]
    if any(s >= num_slots for s in used):
        raise UsageError(f"{where}: a node reads or writes a slot outside the graph; compile it again")
    for n in nodes:
        _check_created_size(n, where)
    return graph, {_slot(c): _slot(o) for c, o in doc["carry"]}


def _check_created_size(node: Node, where: str) -> None:
    """A creation op (zeros, full, arange, randn...) allocates what its arguments say, not what the plan
    declares: its arguments must make exactly the declared output -- checked on the meta device, where
    nothing is allocated -- and that output must fit in this machine's memory."""
    from ..dtypes import to_torch
    from ..ops import OPS
    op = OPS.get(node.op)
    if op is None or op.kind != "creation" or not isinstance(node.target, torch._ops.OpOverload):
        return
    declared = node.output_meta[0] if len(node.output_meta) == 1 else None
    if declared is None or declared.nbytes > _memory_bytes():
        raise UsageError(f"{where}: node {_shown(node.name)} ({node.op}) declares an output of "
                         f"{declared.nbytes if declared else 'no'} bytes, more than this machine's memory; "
                         "compile it again")
    metas = dict(zip(node.inputs, node.input_meta))

    def on_meta(v):
        if isinstance(v, Ref):
            m = metas.get(v.slot) or declared
            return torch.empty(m.shape, dtype=to_torch(m.dtype), device="meta")
        return type(v)(on_meta(x) for x in v) if isinstance(v, (list, tuple)) else v
    try:
        out = node.target(*on_meta(node.args), **{k: on_meta(v) for k, v in node.kwargs.items()
                                                   if k not in ("device", "pin_memory")}, device="meta")
        ok = isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(declared.shape)
    except Exception:          # arguments torch refuses: the real kernel would refuse them too, or worse
        ok = False
    if not ok:
        raise UsageError(f"{where}: node {_shown(node.name)} ({node.op}) would create something other than the "
                         f"{declared.dtype}{list(declared.shape)} it declares; compile it again")


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):     # no sysconf (Windows): what a large host has
        return 1 << 40


def plan_backend(doc: dict, where: str) -> str:
    """The backend spec a plan may choose by itself: any registered backend (numpy, torch:DEVICE, a stack,
    an installed vendor's package: runtime/registry.py), or a sim:NAME description the user has (bundled or in
    $OPSCOPE_HOME/backends) whose implementation is registered. Never a description file's path, never a
    description that imports a module by path: for those the user passes -b."""
    from .. import backends as _backends
    from .. import registry
    try:
        spec = doc["backend"]["spec"]
    except (KeyError, TypeError):
        raise UsageError(f"{where}: corrupted (no backend); compile it again") from None
    from .. import autoplace
    if autoplace.is_auto(spec):             # -b auto[:stacks]: registered backends only, by its own check
        autoplace.candidates(spec)
        return spec.strip()
    base, _, rest = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if registry.get(base) is None or \
            not re.fullmatch(r"[A-Za-z0-9_.:-]{0,64}", rest) or (base == "sim" and not rest):
        raise UsageError(f"{where} was compiled for backend {_spec_shown(spec)}; a plan does not choose a "
                         f"description file (nor the module it imports) by itself: pass -b {_spec_shown(spec)}, or "
                         "another backend, to run it")
    impl = _backends.describe(spec)[0].implementation
    if registry.get(impl) is None:
        raise UsageError(f"{where} runs on {spec}, whose description imports module {_shown(impl)}; a plan does "
                         f"not choose a module by itself: pass -b {spec} to choose it yourself")
    return spec


def load_plan(path, *, model, inputs, backend=None, trust: dict | None = None) -> LoadedPlan:
    """Read, check and bind a plan; `backend` defaults to the plan's own (see plan_backend). `trust`: the
    public keys one of which must have signed it (plan_sign.load_trusted_keys)."""
    t0 = time.perf_counter()
    doc, files = read_plan(path, trust)
    return bind_plan(doc, files, path, model=model, inputs=inputs, backend=backend, t0=t0)


def bind_plan(doc: dict, files: dict, path, *, model, inputs, backend=None, t0: float | None = None) -> LoadedPlan:
    """A plan read by read_plan, checked against MODEL and bound to a backend."""
    from .. import backends as _backends
    from ..executor import Executor, apply_memory_plan, compile_plan
    from . import fuse, layout  # noqa: F401 -- their ops (fused, relayout) must be registered
    t0 = time.perf_counter() if t0 is None else t0
    where = f"plan {path}"
    backend = backend or _backends.resolve(plan_backend(doc, where), trusted=False)
    check_plan(doc, path, model=model, inputs=inputs, backend=backend)
    try:
        graph, carry = decode_graph(doc, files, model, where)
        plan_regions.arm(backend, plan_regions.declared(doc, where), files, where,
                         plan_regions.declared_splits(doc, where))
        from .. import autoplace
        if autoplace.is_auto(backend.name):
            autoplace.arm(backend, doc.get("auto"), where)
        plan = compile_plan(graph, backend, carry=carry, passes=[])
        regions = plan_regions.loaded(plan)
        placed = [[n.name, b.name] for n, b in plan.placement.assignments]
        if placed != doc["placement"]:
            raise UsageError(f"{where}: {backend.name} now places the graph differently than when it was "
                             "compiled: recompile it (--recompile)")
        plan.passes, plan.pass_log = [_str(p) for p in doc["passes"]], list(doc["pass_log"])
        if "memplan" in plan.passes:
            apply_memory_plan(plan)
        timing = doc.get("timing") or {}
        before = float(timing.get("capture_seconds", 0.0)) + float(timing.get("compile_seconds", 0.0))
    except UsageError:
        raise
    except Exception as e:        # a plan.json with a valid checksum but a shape we do not read
        raise UsageError(f"{where}: not a plan this opscope can read ({type(e).__name__}: "
                         f"{first_line(e)[:80]}); compile it again") from None
    startup = time.perf_counter() - t0
    info = {"path": str(path), "backend": backend.name, "passes": plan.passes, "train": bool(doc.get("train")),
            "startup_seconds": startup, "capture_seconds": before, "saved_seconds": before - startup,
            "memory_plan": plan.memory_plan, **regions}
    return LoadedPlan(plan, Executor(plan), info)


def open_plan_session(path, model_spec: str, backend_spec: str | None = None, *, recompile: bool = False,
                      trust: dict | None = None):
    """A runtime Session from a plan file (what `opscope run MODEL --plan FILE` does): MODEL gives the
    inputs and weights; `backend_spec`, when given, must be the plan's. `recompile`: a stale plan
    (description or versions changed) is compiled again with the same passes and rewritten. `trust`:
    run it only if one of these public keys signed it."""
    from .. import backends as _backends, models
    from ..session import Session
    if recompile and trust is not None:
        raise UsageError("--recompile rewrites the plan unsigned: it cannot be used with --trust (compile it "
                         "again with `opscope compile ... --sign KEY`)")
    t0 = time.perf_counter()
    doc, files = read_plan(path, trust)
    spec = backend_spec or plan_backend(doc, f"plan {path}")     # before the model loads: a refusal is quick
    model, inputs = (models.load_train if doc.get("train") else models.load)(model_spec)
    backend = _backends.resolve(backend_spec) if backend_spec else None
    try:
        loaded = bind_plan(doc, files, path, model=model, inputs=inputs, backend=backend, t0=t0)
    except UsageError as e:
        if not recompile or "recompile" not in str(e):
            raise
        compile_to_file(path, model_spec, spec, passes=doc["passes"], train=bool(doc.get("train")))
        loaded = load_plan(path, model=model, inputs=inputs, backend=backend)
        loaded.info["recompiled"] = True
    s = Session(model_spec, model, inputs, loaded.plan.graph, loaded.plan.backend, loaded.plan, loaded.executor,
                loaded.info["startup_seconds"])
    s.extra["plan"] = loaded.info
    return s


def compile_to_file(path, model_spec: str, backend_spec: str, *, passes=None, train: bool = False,
                    allow_fallback: bool = True, optimizer=None, sign=None) -> dict:
    """Capture, run the passes, place, save: `opscope compile`. `passes` None: every pass the
    description does not switch off. `sign`: a private key file; the plan gets plan.sig."""
    from .. import backends as _backends, models
    from ..capture import capture
    from ..executor import compile_plan
    from . import described, pass_names
    key = plan_sign.load_signing_key(sign) if sign is not None else None      # a bad key fails before capture
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
                     train=train, timing={"capture_seconds": t1 - t0, "compile_seconds": t2 - t1}, sign_key=key)
    info["pass_log"] = plan.pass_log
    info["path"] = str(path)
    if plan.placement.auto is not None:
        info["auto"] = plan.placement.auto
    if key is not None:
        info["signed_by"] = plan_sign.key_id(key.public_key())
    return info
