"""Joint capture: a loss-returning model -> one opscope Graph of forward, loss and backward.

Why not `aot_export_module(..., trace_joint=True)` as is: it traces the joint graph twice, and
the second trace (which flattens the calling convention) drops every node's metadata -- no
`seq_nr`, no module path, no source line -- so a backward op could not say which forward op it
differentiates. We run the same AOTAutograd stage it runs (`_aot_export_function`, functionalized,
ATen backward ops such as `gelu_backward`) once, under `preserve_node_meta()`, and keep that graph:

- `seq_nr`: the autograd sequence number of the forward op; a backward node carries the number of
  the grad_fn it came from, so backward -> forward is an exact lookup, not a guess.
- `partitioner_tag`: is_forward / is_backward.
- module path and source line: module hooks and a TorchFunctionMode put `nn_module_stack` and
  `stack_trace` into fx's current meta while the forward traces (the first trace has neither).

Every node gets `attrs["phase"]` ('forward' | 'backward'; the optimizer adds 'optimizer') and a
backward node `attrs["fwd_node"]` (the forward node's name) plus that node's module path and source.
"""
from __future__ import annotations

import collections
import contextlib
import sys
import traceback
from dataclasses import dataclass, field

import torch
import torch.fx.traceback as fxt

from ..capture import not_the_models, translate
from ..errors import ModelError, UsageError, first_line
from ..graph import Graph, Node
from .masks import host_draws_seeded, mask_assignments



def phase_of(node: Node) -> str:
    """'forward', 'backward' or 'optimizer' ('forward' for a node of an inference graph)."""
    return node.attrs.get("phase", "forward")


def forward_of(node: Node) -> str:
    """The name of the forward node a backward node differentiates ('' if none)."""
    return node.attrs.get("fwd_node", "")


class LossOf(torch.nn.Module):
    """Wraps a model so it returns `(loss,)`: the training contract (a scalar tensor, an object
    with `.loss`, or a tuple whose first element is the loss)."""

    def __init__(self, model: torch.nn.Module, spec: str = ""):
        super().__init__()
        self.model = model
        self.spec = spec

    def forward(self, *inputs):
        return (loss_of(self.model(*inputs), self.spec),)


def loss_of(out, spec: str = "") -> torch.Tensor:
    loss = out
    if not isinstance(out, torch.Tensor):
        loss = getattr(out, "loss", None)
        if loss is None and isinstance(out, (tuple, list)) and out:
            loss = out[0]
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.dtype.is_floating_point:
        what = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(out).__name__
        raise UsageError(f"model {spec or '(unnamed)'} does not return a scalar loss (got {what}); for training "
                         "the model must return the loss: a scalar tensor, an object with .loss, or a tuple "
                         "(loss, ...)")
    return loss


@dataclass
class JointGraph:
    graph: Graph
    param_slots: dict[str, int]            # parameter name -> constant slot
    buffer_slots: dict[str, int]
    grad_slots: dict[str, int]             # parameter name -> slot of its gradient
    buffer_updates: dict[str, int]         # buffer name -> slot of its new value (batch norm stats)
    loss_slot: int
    notes: list[str] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)   # other name of a tied tensor -> its name here


def capture_joint(model: torch.nn.Module, inputs: tuple, name: str = "") -> JointGraph:
    """Trace forward + backward of `model(*inputs)` (which returns the loss) into a Graph."""
    wrapped = LossOf(model, name)
    # One placeholder per tensor, not per name: a tied weight (GPT-2's wte / lm_head, BERT's decoder
    # bias) is one parameter in eager -- one gradient (the sum over its uses), one update -- so it is
    # one input here, and every alias reads it (tie_weights).
    params = dict(wrapped.named_parameters())
    buffers = dict(wrapped.named_buffers())
    names = list(params) + list(buffers)
    flat = list(params.values()) + list(buffers.values())
    aliases = _aliases(wrapped, {id(t): n for n, t in [*params.items(), *buffers.items()]})
    from torch._functorch.aot_autograd import _aot_export_function
    from torch.nn.utils.stateless import _reparametrize_module

    def call(*args):
        # host-drawn masks (SpecAugment) from the seeded rule's generator, afresh at each of AOTAutograd's passes;
        # their boolean writes become `where` (mask_assignments, below)
        with _reparametrize_module(wrapped, dict(zip(names, args[:len(flat)])), tie_weights=True), \
                host_draws_seeded():
            return wrapped(*args[len(flat):])

    paths = {id(m): (p[len("model."):] if p.startswith("model.") else p, type(m).__qualname__)
             for p, m in wrapped.named_modules() if m is not wrapped and m is not model}
    try:
        with fxt.preserve_node_meta(), _module_meta(paths), _tracing_flags(), mask_assignments():
            fx_g, meta, _, _ = _aot_export_function(call, tuple(flat) + tuple(inputs), num_params_buffers=len(flat),
                                                    no_tangents=True, trace_joint=True)
    except UsageError:
        raise
    except Exception as e:  # torch raises many types; the user needs the first line
        raise ModelError(f"training capture failed for {name or type(model).__name__}: {type(e).__name__}: "
                         f"{first_line(e)}") from e
    joint = _to_graph(fx_g, meta, names, params, buffers, flat, name or type(model).__name__)
    joint.aliases = {_unwrap(k): _unwrap(v) for k, v in aliases.items()}
    return joint


def _aliases(module: torch.nn.Module, canonical: dict[int, str]) -> dict[str, str]:
    """Every other name of a tied tensor -> the name its one placeholder has."""
    out = {}
    for n, t in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
        first = canonical.get(id(t))
        if first is not None and first != n:
            out[n] = first
    return out


def _tracing_flags():
    """Tell the model it is being traced, as torch.export's non-strict mode does.

    Libraries skip data-dependent Python branches when `torch.compiler.is_compiling()` says a trace
    is running (transformers' packed-sequence and all-ones-mask checks call `.item()` otherwise, which
    a fake tensor cannot answer). Our capture is such a trace -- the same make_fx/AOTAutograd stack
    non-strict export runs -- so it sets the same flags rather than asking for special inputs."""
    try:
        from torch._export.utils import _compiling_state_context
    except ImportError:                              # older torch: set the public flag ourselves
        return _compiling_flag()
    return _compiling_state_context()


@contextlib.contextmanager
def _compiling_flag():
    old = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        yield
    finally:
        torch.compiler._is_compiling_flag = old


@contextlib.contextmanager
def _module_meta(paths):
    """Put the module path and the Python stack into fx's current meta while the forward traces."""
    stack: list = []

    def pre(mod, args):
        if id(mod) in paths:
            stack.append(paths[id(mod)])
            fxt.current_meta["nn_module_stack"] = collections.OrderedDict((p, (p, t)) for p, t in stack)

    def post(mod, args, out):
        if id(mod) in paths and stack:
            stack.pop()
            fxt.current_meta["nn_module_stack"] = collections.OrderedDict((p, (p, t)) for p, t in stack)

    h1 = torch.nn.modules.module.register_module_forward_pre_hook(pre)
    h2 = torch.nn.modules.module.register_module_forward_hook(post)
    try:
        with _StackTraces():
            yield
    finally:
        h1.remove()
        h2.remove()


class _StackTraces(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if fxt.current_meta.get("in_grad_fn", 0) == 0:      # the backward keeps its forward's trace
            fxt.current_meta["stack_trace"] = _calling_frame(sys._getframe(1))
        return func(*args, **(kwargs or {}))


def _calling_frame(frame) -> str:
    """The innermost frame outside torch and opscope's runtime, in fx's stack_trace format: all that capture reads of a trace (the
    node's source line). NOTE: formatting the whole stack on every torch call (each reads its source lines)
    was a third of capturing a Swin or DeiT for training."""
    # past torch and opscope's own torch function modes (masks.py's seeded draws): the model's line
    while frame is not None and not_the_models(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return ""
    return "".join(traceback.format_list([traceback.FrameSummary(frame.f_code.co_filename, frame.f_lineno,
                                                                 frame.f_code.co_name)]))


def _to_graph(fx_g, meta, names, params, buffers, flat, model_name) -> JointGraph:
    g = fx_g.graph
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    n_state = len(flat)
    constants = {ph.name: flat[i].detach().clone() for i, ph in enumerate(placeholders[:n_state])}
    # the tangent placeholder AOTAutograd adds (no_tangents: the loss's grad is ones_like inside)
    for ph in placeholders:
        if ph.name.startswith("tangents"):
            constants[ph.name] = None
    outs = list(g.output_node().args[0])
    n_mut = meta.num_mutated_inp_runtime_indices
    mutated = [i for i, info in enumerate(meta.input_info) if info.mutates_data or info.mutates_metadata]
    grads = outs[n_mut + 1:]
    # AOTAutograd returns one gradient per input (state inputs first, then the user's), None where none
    # flows; the step needs those of the parameters (a user input's, if it requires grad, is dropped)
    reached = [i for i, gnode in enumerate(grads[:n_state]) if gnode is not None]
    picked = list(range(n_mut + 1)) + [n_mut + 1 + i for i in reached]
    _link_backward(g)
    graph = translate(g, model_name, constants=constants, outputs=picked)
    by_name = {n.name: n for n in graph.nodes}
    for fx in g.nodes:
        node = by_name.get(fx.name)
        if node is not None:
            node.attrs["phase"] = "backward" if fx.meta.get("partitioner_tag") == "is_backward" else "forward"
            if fx.meta.get("_opscope_fwd"):
                node.attrs["fwd_node"] = fx.meta["_opscope_fwd"]
    slot_of_ph = {ph.name: s for s, ph in enumerate(placeholders)}   # translate numbers placeholders first
    param_slots = {names[i]: slot_of_ph[placeholders[i].name] for i in range(len(params))}
    buffer_slots = {names[i]: slot_of_ph[placeholders[i].name] for i in range(len(params), n_state)}
    refs = graph.output_refs
    buffer_updates = {names[i]: refs[k].slot for k, i in enumerate(mutated[:n_mut])}
    grad_slots = {names[i]: r.slot for i, r in zip(reached, refs[n_mut + 1:])}
    return JointGraph(graph, _strip(param_slots), _strip(buffer_slots), _strip(grad_slots), _strip(buffer_updates),
                      refs[n_mut].slot)


def _strip(d: dict) -> dict:
    return {_unwrap(k): v for k, v in d.items()}


def _unwrap(name: str) -> str:
    """A parameter name as the user's model spells it (without the wrapper's `model.`)."""
    return name[len("model."):] if name.startswith("model.") else name


def _link_backward(g) -> None:
    """Give each backward fx node its forward node's module path and source, and its name."""
    first: dict[int, torch.fx.Node] = {}
    for fx in g.nodes:
        if fx.op == "call_function" and fx.meta.get("partitioner_tag") == "is_forward" and "seq_nr" in fx.meta:
            first.setdefault(fx.meta["seq_nr"], fx)
    for fx in g.nodes:
        if fx.op != "call_function" or fx.meta.get("partitioner_tag") != "is_backward":
            continue
        fwd = first.get(fx.meta.get("seq_nr"))
        if fwd is None:
            continue
        fx.meta["_opscope_fwd"] = fwd.name
        for key in ("nn_module_stack", "stack_trace"):
            if fwd.meta.get(key):
                fx.meta[key] = fwd.meta[key]
