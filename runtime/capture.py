"""Capture: nn.Module + example inputs -> opscope Graph, through torch.export.

We keep the pre-dispatch ATen graph that `torch.export.export` returns and map each ATen
overload to an opscope op. We do not call `run_decompositions()`: it fails on real models
(GPT-2 under torch 2.13, a view over non-contiguous strides) and would hide the ops users
wrote (`linear`, `layer_norm`, `scaled_dot_product_attention`) behind their pieces.
"""
from __future__ import annotations

import operator as _pyop
import os
import re

import torch
from torch.export import ExportGraphSignature

from .dtypes import name_of
from .errors import ModelError, first_line
from .graph import Graph, Node, Ref, TensorMeta
from .ops import op_for_target

# Nodes that check invariants at trace time and compute nothing.
_DROP = re.compile(r"^aten\.(_assert_\w+|sym_constrain_range\w*|_functional_assert\w*)|^_operator\.")
_TORCH_DIR = os.path.dirname(torch.__file__)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)')


def capture(model: torch.nn.Module, example_inputs: tuple, name: str = "") -> Graph:
    """Export `model` on `example_inputs` and translate the result into an opscope Graph."""
    model.eval()
    try:
        with torch.no_grad():
            ep = torch.export.export(model, tuple(example_inputs), strict=False)
    except Exception as e:  # torch raises many types here; the user needs the first line
        raise ModelError(f"capture failed for {name or type(model).__name__}: {type(e).__name__}: {first_line(e)}") from e
    return _translate(ep, name or type(model).__name__)


def _meta(val) -> TensorMeta | None:
    if isinstance(val, torch.Tensor):
        return TensorMeta(tuple(int(s) for s in val.shape), name_of(val.dtype))
    return None


def _source(fx_node) -> tuple[str, str]:
    trace = fx_node.meta.get("stack_trace") or ""
    frames = _FRAME.findall(trace)
    if not frames:
        return "", ""
    # The innermost frame outside torch itself is the line the user (or the model library) wrote.
    user = [f for f in frames if not f[0].startswith(_TORCH_DIR)]
    path, line, code = (user or frames)[-1]
    return f"{path}:{line}", code.strip()


def _module(fx_node) -> tuple[str, str]:
    stack = fx_node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, typ = list(stack.values())[-1]
    typ = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    return path, typ.rsplit(".", 1)[-1]


def _translate(ep, model_name: str) -> Graph:
    sig: ExportGraphSignature = ep.graph_signature
    slots: dict = {}               # fx node -> slot, or (fx node, i) -> slot for multi outputs
    slot_meta: dict[int, TensorMeta] = {}
    constants: dict[int, torch.Tensor] = {}
    input_slots: list[int] = []
    nodes: list[Node] = []
    counter = [0]

    def new_slot(meta=None):
        s = counter[0]
        counter[0] += 1
        if meta is not None:
            slot_meta[s] = meta
        return s

    lifted = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    user_inputs = set(sig.user_inputs)

    def sub(a, inputs):
        if isinstance(a, torch.fx.Node):
            s = slots[a]
            inputs.append(s)
            return Ref(s)
        if isinstance(a, (list, tuple)):
            return type(a)(sub(x, inputs) for x in a) if not isinstance(a, torch.fx.immutable_collections.immutable_list) \
                else [sub(x, inputs) for x in a]
        return a

    for fx in ep.graph.nodes:
        if fx.op == "placeholder":
            s = new_slot(_meta(fx.meta.get("val")))
            slots[fx] = s
            if fx.name in lifted:
                key = lifted[fx.name]
                t = ep.state_dict[key] if key in ep.state_dict else ep.constants[key]
                constants[s] = t.detach()
            elif fx.name in user_inputs:
                input_slots.append(s)
            else:
                constants[s] = None          # token / unused input
            continue
        if fx.op == "output":
            outs = fx.args[0]
            user_out = [i for i, spec in enumerate(sig.output_specs) if spec.kind.name == "USER_OUTPUT"]
            flat = [outs[i] for i in user_out] if len(sig.output_specs) == len(outs) else list(outs)
            output_refs = [Ref(slots[o]) if isinstance(o, torch.fx.Node) else o for o in flat]
            continue
        if fx.op != "call_function":
            raise ModelError(f"capture: unexpected node kind {fx.op!r} at {fx.name}")
        target = fx.target
        if target is _pyop.getitem:
            producer, i = fx.args
            slots[fx] = slots[(producer, i)]
            continue
        tname = str(target)
        if _DROP.match(tname):
            continue
        op = op_for_target(target) or f"aten:{tname.split('.')[1] if tname.startswith('aten.') else tname}"
        inputs: list[int] = []
        args = sub(tuple(fx.args), inputs)
        kwargs = {k: sub(v, inputs) for k, v in fx.kwargs.items()}
        val = fx.meta.get("val")
        multi = isinstance(val, (list, tuple))
        if multi:
            metas = [_meta(v) for v in val]
            outs = []
            for i, m in enumerate(metas):
                s = new_slot(m)
                slots[(fx, i)] = s
                outs.append(s)
        else:
            metas = [_meta(val)]
            s = new_slot(metas[0])
            slots[fx] = s
            outs = [s]
        attrs = {}
        schema = getattr(target, "_schema", None)
        if schema is not None:
            for arg_schema, a in zip(schema.arguments, fx.args):
                if not isinstance(a, torch.fx.Node) and not (isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.fx.Node)):
                    attrs[arg_schema.name] = a
            for k, v in fx.kwargs.items():
                if not isinstance(v, torch.fx.Node) and k not in ("device", "layout", "pin_memory"):
                    attrs[k] = v
        module_path, module_type = _module(fx)
        source, line = _source(fx)
        nodes.append(Node(
            index=len(nodes), name=fx.name, op=op, target=target, args=args, kwargs=kwargs,
            inputs=inputs, outputs=outs, input_meta=[slot_meta.get(s) or TensorMeta((), "float32") for s in inputs],
            output_meta=metas, attrs={k: _plain(v) for k, v in attrs.items()}, module_path=module_path,
            module_type=module_type, source=source, source_line=line, multi_output=multi))
    return Graph(nodes=nodes, num_slots=counter[0], input_slots=input_slots, constant_slots=constants,
                 output_refs=output_refs, slot_meta=slot_meta, model_name=model_name)


def _plain(v):
    """Attributes as JSON-friendly values (dtypes and devices by name)."""
    if isinstance(v, torch.dtype):
        return name_of(v)
    if isinstance(v, (torch.device, torch.layout, torch.memory_format)):
        return str(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v
