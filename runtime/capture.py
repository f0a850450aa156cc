"""Capture: nn.Module + example inputs -> opscope Graph.

Two front ends share one translation (`translate`), from an FX graph of ATen calls to opscope
nodes: `capture()` runs torch.export, and the torch.compile backend (runtime/dynamo.py) hands
over the forward and backward graphs AOTAutograd makes of each region TorchDynamo captured.

For torch.export we keep the pre-dispatch ATen graph and map each ATen overload to an opscope
op. We do not call `run_decompositions()`: it fails on real models (GPT-2 under torch 2.13, a
view over non-contiguous strides) and would hide the ops users wrote (`linear`, `layer_norm`,
`scaled_dot_product_attention`) behind their pieces.

An op opscope does not map keeps its own name and namespace -- `aten:lstm`,
`transformers:grouped_mm_fallback` -- so a backend that knows it (torch) can still run it.
"""
from __future__ import annotations

import contextlib
import io
import logging
import operator as _pyop
import os
import re
import threading
import warnings

import torch
from torch.export import ExportGraphSignature

from .dtypes import name_of
from .errors import ModelError, first_line
from .graph import Graph, Node, Ref, TensorMeta
from .ops import op_for_target
from .outputs import tensor_outputs

# Nodes that check invariants at trace time and compute nothing.
_DROP = re.compile(r"^aten\.(_assert_\w+|sym_constrain_range\w*|_functional_assert\w*)|^_operator\.")
_TORCH_DIR = os.path.dirname(torch.__file__)
_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_DEMOS_DIR = os.path.join(_RUNTIME_DIR, "demos") + os.sep     # the bundled models: their lines are the model's


def not_the_models(path: str) -> bool:
    """A frame of torch's or of opscope's runtime (its torch function modes sit between a model and torch), not
    of the model: capture names a node after the innermost frame that is not one of these."""
    return path.startswith(_TORCH_DIR) or (path.startswith(_RUNTIME_DIR) and not path.startswith(_DEMOS_DIR))
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)')


def capture(model: torch.nn.Module, example_inputs: tuple, name: str = "") -> Graph:
    """Export `model` on `example_inputs` and translate the result into an opscope Graph."""
    return translate_export(export(model, example_inputs, name), name or type(model).__name__)


class ExportRefused(ModelError):
    """torch.export itself refused the model (as opposed to opscope failing on what it exported)."""


def export(model: torch.nn.Module, example_inputs: tuple, name: str = "") -> torch.export.ExportedProgram:
    """torch.export of `model` in eval mode without grad; ExportRefused (one line) when torch refuses it.
    Outputs torch's pytree does not know (a DynamicCache) become the tuples of tensors they hold (runtime/outputs.py)."""
    model.eval()
    try:
        # a KV cache among the outputs (transformers' use_cache=True) is traced as the tensors it holds
        with torch.no_grad(), tensor_outputs(model), quiet_torch():
            return torch.export.export(model, tuple(example_inputs), strict=False)
    except Exception as e:  # torch raises many types here; the user needs the first line
        raise ExportRefused(f"capture failed for {name or type(model).__name__}: {type(e).__name__}: "
                            f"{first_line(e)}{dynamo_hint(e)}") from e


# torch.export refuses Python that depends on tensor values (a loop over `int(x.sum())`, Mixtral's eager loop
# over the experts a batch routes to); TorchDynamo runs such code between graph breaks.
_DATA_DEPENDENT = ("GuardOnDataDependentSymNode", "DataDependentOutputException", "UserError", "Unsupported",
                   "UnsupportedOperatorException", "PendingUnbackedSymbolNotFound")


def dynamo_hint(e: BaseException) -> str:
    """'; --capture dynamo ...' when what stopped torch.export is what torch.compile's graph breaks handle."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if {c.__name__ for c in type(e).__mro__} & set(_DATA_DEPENDENT) or "data-dependent" in str(e).lower():
            return ("; the model's Python depends on tensor values, which torch.export cannot trace: "
                    "--capture dynamo (run, profile, debug) captures it in regions between graph breaks")
        e = e.__cause__ or e.__context__
    return ""


@contextlib.contextmanager
def quiet_torch():
    """torch's own logs, warnings and stderr off while it traces: a failing fake-tensor op logs a 19-line
    "E1204 ... Traceback" and torch.export prints the partial graph to stderr before raising, and opscope
    reports the raised error in one line. OPSCOPE_DEBUG=1 keeps everything."""
    if os.environ.get("OPSCOPE_DEBUG", "") not in ("", "0"):
        yield
        return
    loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)
               if n == "torch" or n.startswith("torch.")]
    was = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    # NOTE: sys.stderr is the process's: swapped from a worker thread (the debugger captures in one) it would swallow
    # what the main thread writes meanwhile -- the TUI, and the one line a Ctrl-C prints. Only the main thread swaps it.
    swap = threading.current_thread() is threading.main_thread()
    try:
        with warnings.catch_warnings(), (contextlib.redirect_stderr(io.StringIO()) if swap else contextlib.nullcontext()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, disabled in zip(loggers, was):
            lg.disabled = disabled


def translate_export(ep: torch.export.ExportedProgram, model_name: str) -> Graph:
    """An ExportedProgram's graph: lifted parameters, buffers and constants become constant slots."""
    sig: ExportGraphSignature = ep.graph_signature
    lifted = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    user_inputs = set(sig.user_inputs)
    constants: dict = {}
    for fx in ep.graph.nodes:
        if fx.op != "placeholder" or fx.name in user_inputs:
            continue
        key = lifted.get(fx.name)
        if key is None:
            constants[fx.name] = None        # a token or an unused input
        else:
            t = ep.state_dict[key] if key in ep.state_dict else ep.constants[key]
            constants[fx.name] = t.detach()
    user_out = [i for i, spec in enumerate(sig.output_specs) if spec.kind.name == "USER_OUTPUT"]
    returned = ep.graph.output_node().args[0]
    # Mutated buffers come first among the outputs; the spec list says which outputs are the user's.
    return translate(ep.graph, model_name, constants=constants,
                     outputs=user_out if len(sig.output_specs) == len(returned) else None)


def translate(fx_graph: torch.fx.Graph, model_name: str, *, constants: dict | None = None,
              outputs: list[int] | None = None) -> Graph:
    """An FX graph of ATen calls -> an opscope Graph.

    Every placeholder is a user input, in order, unless `constants` maps its name to a tensor
    (parameters, buffers; None for a token nobody reads). `outputs` picks which of the graph's
    outputs the Graph returns (all by default). Node metadata (`val`, `stack_trace`,
    `nn_module_stack`) gives shapes, source lines and module paths; torch.export and
    AOTAutograd both keep it.
    """
    constants = constants or {}
    slots: dict = {}               # fx node -> slot, or (fx node, i) -> slot for multi outputs
    slot_meta: dict[int, TensorMeta] = {}
    constant_slots: dict[int, torch.Tensor | None] = {}
    input_slots: list[int] = []
    nodes: list[Node] = []
    output_refs: list = []
    counter = [0]

    def new_slot(meta=None):
        s = counter[0]
        counter[0] += 1
        if meta is not None:
            slot_meta[s] = meta
        return s

    def sub(a, inputs):
        if isinstance(a, torch.fx.Node):
            s = slots[a]
            inputs.append(s)
            return Ref(s)
        if isinstance(a, (list, tuple)):
            return type(a)(sub(x, inputs) for x in a) if not isinstance(a, torch.fx.immutable_collections.immutable_list) \
                else [sub(x, inputs) for x in a]
        return a

    checks = _runtime_checks(fx_graph)
    for fx in fx_graph.nodes:
        if fx in checks:
            continue
        if fx.op == "placeholder":
            s = new_slot(_meta(fx.meta.get("val")))
            slots[fx] = s
            if fx.name in constants:
                constant_slots[s] = constants[fx.name]
            else:
                input_slots.append(s)
            continue
        if fx.op == "output":
            outs = fx.args[0]
            outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
            flat = [outs[i] for i in outputs] if outputs is not None else outs
            output_refs = [Ref(slots[o]) if isinstance(o, torch.fx.Node) else o for o in flat]
            continue
        if fx.op == "get_attr":
            # A tensor the trace lifted out of the forward (`torch.tensor(0)`, T5's relative-position buckets, a
            # buffer built in forward): AOTAutograd and dynamo keep it as an attribute of the graph module, so it
            # is a constant slot like a parameter, on every path that translates.
            value = _attribute(fx_graph, fx)
            s = new_slot(_meta(value))
            slots[fx] = s
            constant_slots[s] = value
            continue
        if fx.op != "call_function":
            raise ModelError(f"capture: unexpected node kind {fx.op!r} at {fx.name}")
        target = fx.target
        if target is _pyop.getitem and isinstance(fx.args[0], torch.fx.Node) and (fx.args[0], fx.args[1]) in slots:
            producer, i = fx.args
            slots[fx] = slots[(producer, i)]
            continue
        if _DROP.match(str(target)):
            continue
        op = op_for_target(target) or implicit_composite(target) or op_name(target)
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
        module_path, module_type = _module(fx)
        source, line = _source(fx)
        nodes.append(Node(
            index=len(nodes), name=fx.name, op=op, target=target, args=args, kwargs=kwargs,
            inputs=inputs, outputs=outs, input_meta=[slot_meta.get(s) or TensorMeta((), "float32") for s in inputs],
            output_meta=metas, attrs=_attrs(fx), module_path=module_path,
            module_type=module_type, source=source, source_line=line, multi_output=multi))
    return Graph(nodes=nodes, num_slots=counter[0], input_slots=input_slots, constant_slots=constant_slots,
                 output_refs=output_refs, slot_meta=slot_meta, model_name=model_name)


def _attribute(fx_graph, fx) -> torch.Tensor:
    """The tensor a get_attr node names, from the graph's module (a dotted path)."""
    value = fx_graph.owning_module
    for part in str(fx.target).split("."):
        value = getattr(value, part, None)
    if not isinstance(value, torch.Tensor):
        raise ModelError(f"capture: get_attr {fx.target} at {fx.name} is not a tensor "
                         f"({type(value).__name__}); opscope lifts only tensor constants")
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():          # dynamo translates under its fake mode; the constant is a real tensor
        return value.detach()


def _runtime_checks(fx_graph) -> set:
    """Nodes that only check invariants: the asserts, and the Python comparisons of sizes (`u0 >= 0` on a
    data-dependent size) that feed nothing but asserts. They compute nothing a later node reads."""
    dropped: set = set()
    for fx in reversed(list(fx_graph.nodes)):
        if fx.op != "call_function":
            continue
        if _DROP.match(str(fx.target)) and getattr(fx.target, "__module__", "") != "_operator":
            dropped.add(fx)
        elif getattr(fx.target, "__module__", "") == "_operator" and fx.users and all(u in dropped for u in fx.users):
            dropped.add(fx)
    return dropped


def implicit_composite(target) -> str | None:
    """The op name for an op opscope does not map that torch defines in other ops -- its CompositeImplicitAutograd
    kernel, or a decomposition in torch._decomp -- registered as a composition on first sight, else None. Backends with a kernel for the ATen op
    (torch) run it as is; the others run its definition."""
    from .ops import OPS
    from .ops.registry import OpDef
    name = getattr(target, "name", None)
    if not isinstance(target, torch._ops.OpOverload) or not callable(name):
        return None
    from torch._decomp import decomposition_table
    try:
        implicit = torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd")
    except RuntimeError:
        implicit = False
    # else torch's own Python decomposition of the op (torch._decomp: huber_loss, mish, logsumexp, ...)
    body = (lambda *a, **k: target.decompose(*a, **k)) if implicit else decomposition_table.get(target)
    if body is None:
        return None
    op = op_name(target).split(":", 1)[1] if target.namespace == "aten" else op_name(target)
    if op not in OPS:
        how = "CompositeImplicitAutograd kernel" if implicit else "torch._decomp decomposition"
        OPS[op] = OpDef(op, "custom", None, (), None, doc=f"{target.name()}: defined by its {how}", torch=target,
                        composite=body, extra={"implicit": True})
    return op if OPS[op].composite is not None else None


def op_name(target) -> str:
    """The name of an op opscope does not map: `aten:topk`, `transformers:grouped_mm_fallback`.

    The namespace stays, so a custom op is never mistaken for an ATen one (a backend that
    passes ATen ops through must not guess at a library's op).
    """
    schema_name = getattr(getattr(target, "_schema", None), "name", None)      # "aten::topk"
    if schema_name and "::" in schema_name:
        ns, name = schema_name.split("::", 1)
        return f"{ns}:{name}"
    name = getattr(target, "__name__", None) or str(target)
    module = getattr(target, "__module__", None) or "python"
    return f"{module.rsplit('.', 1)[-1].lstrip('_')}:{name}"


def _attrs(fx) -> dict:
    """Non-tensor arguments by schema name, as JSON-friendly values."""
    attrs = {}
    schema = getattr(fx.target, "_schema", None)
    if schema is None:
        return attrs
    for arg_schema, a in zip(schema.arguments, fx.args):
        if not isinstance(a, torch.fx.Node) and not (isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.fx.Node)):
            attrs[arg_schema.name] = a
    for k, v in fx.kwargs.items():
        if not isinstance(v, torch.fx.Node) and k not in ("device", "layout", "pin_memory"):
            attrs[k] = v
    return {k: _plain(v) for k, v in attrs.items()}


def _meta(val) -> TensorMeta | None:
    if isinstance(val, torch.Tensor):
        return TensorMeta(tuple(_size(s) for s in val.shape), name_of(val.dtype))
    return None


def _size(s) -> int:
    """A dim as an int. NOTE: a data-dependent one (nonzero, unique, masked_select: torch.export's unbacked
    symbols) is known only when the op runs; it is recorded as 0, so cost models count that output as empty."""
    try:
        return int(s)
    except Exception:  # torch raises GuardOnDataDependentSymNode, a private class
        return 0


def _source(fx_node) -> tuple[str, str]:
    trace = fx_node.meta.get("stack_trace") or ""
    frames = _FRAME.findall(trace)
    if not frames:
        return "", ""
    # The innermost frame outside torch itself -- and outside opscope's runtime, whose torch function modes (the
    # seeded draws, mask writes) sit between the model and torch -- is the line the user (or the model library) wrote.
    user = [f for f in frames if not not_the_models(f[0])]
    path, line, code = (user or frames)[-1]
    return f"{path}:{line}", code.strip()


def _module(fx_node) -> tuple[str, str]:
    # AOTAutograd's backward nodes carry the module stack of the forward op they differentiate.
    stack = fx_node.meta.get("nn_module_stack") or fx_node.meta.get("fwd_nn_module_stack") or {}
    if not stack:
        return "", ""
    path, typ = list(stack.values())[-1]
    typ = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    return module_path(path), typ.rsplit(".", 1)[-1]


def module_path(path: str) -> str:
    """A module path as named_modules() spells it. TorchDynamo writes the Python expression it
    reached the module by (`L['self'].layers[0]._modules['mlp']`); torch.export the plain path."""
    if not path.startswith(("L[", "G[")):
        return path
    path = re.sub(r"^[LG]\['[^']*'\]", "", path)
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    return path.lstrip(".")


def _plain(v):
    """Attributes as JSON-friendly values (dtypes and devices by name)."""
    if isinstance(v, torch.dtype):
        return name_of(v)
    if isinstance(v, (torch.device, torch.layout, torch.memory_format)):
        return str(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v
