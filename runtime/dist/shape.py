"""What a parallel strategy divides, read off the captured training graph of one share.

    shape = model_shape("demo:gpt", train_graph, local_inputs)
    shape.param_bytes, shape.grad_bytes, shape.state_bytes, shape.activation_bytes, shape.tokens
    shape.layers          # numbered modules (model.h.0, ...): bytes, FLOP share, 2-D weights
    shape.stages(2)       # contiguous pipeline stages; shape.row_parallel_outputs(): what tp all-reduces
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Layer:
    name: str
    param_bytes: int = 0
    grad_bytes: int = 0
    flops: float = 0.0
    share: float = 0.0                              # of the forward+backward FLOPs
    weights: list = field(default_factory=list)     # (out features, is an embedding) of each 2-D weight, in order


@dataclass
class ModelShape:
    """What a strategy divides, read off the captured training graph of one share."""
    model: str
    param_bytes: int
    grad_bytes: int
    state_bytes: int
    activation_bytes: int                           # forward values backward reads (saved activations)
    tokens: int                                     # rows x sequence positions of the share
    layers: list[Layer]
    param_sizes: list[int]                          # gradient bytes per parameter, in parameter order

    def grad_sizes(self, scale: float = 1.0) -> list[int]:
        return [max(1, int(s * scale)) for s in self.param_sizes]

    def row_parallel_outputs(self) -> list[int]:
        """Output features of the linears whose output tensor parallelism all-reduces: in each layer the
        second of each pair of 2-D weights (column- then row-parallel, Megatron), an unpaired last one, and
        every embedding (vocabulary-parallel)."""
        out = []
        for lay in self.layers:
            dense = [o for o, emb in lay.weights if not emb]
            out += [o for o, emb in lay.weights if emb]
            out += [dense[i] for i in range(1, len(dense), 2)] + ([dense[-1]] if len(dense) % 2 else [])
        return out

    @property
    def width(self) -> int:
        """The activation width between layers (what a pipeline stage sends): the commonest output width."""
        outs = self.row_parallel_outputs()
        return Counter(outs).most_common(1)[0][0] if outs else 1

    def stages(self, p: int) -> list[dict]:
        """Contiguous stages of near-equal layer counts (Megatron's default), with their shares."""
        chunks = np.array_split(np.arange(len(self.layers)), p)
        total = max(1, self.param_bytes)
        return [{"layers": [self.layers[i].name for i in c], "flops_share": sum(self.layers[i].share for i in c),
                 "param_share": sum(self.layers[i].param_bytes for i in c) / total} for c in chunks]


def _layer_key(path: str) -> str | None:
    """'model.h.3.attn.qkv' -> 'model.h.3' (the prefix up to the first numbered module), None if none."""
    parts = path.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[:i + 1])
    return None


def model_shape(model_spec: str, train, local: tuple) -> ModelShape:
    from ..train.joint import phase_of
    g, joint = train.graph, train.joint
    names = [n for n in joint.param_slots if n in joint.grad_slots]
    meta = g.slot_meta
    embedded = {n.inputs[0] for n in g.nodes if n.op == "embedding" and n.inputs}
    # layers: numbered modules; parameters outside them join the layer before (the first one if none)
    keys = [_layer_key(n) for n in names]
    if not any(keys):
        keys = [n.rpartition(".")[0] or n for n in names]
    order: list[str] = []
    for i, k in enumerate(keys):
        k = k or (keys[i - 1] if i else next(x for x in keys if x))
        keys[i] = k
        if k not in order:
            order.append(k)
    layers = {k: Layer(k) for k in order}
    module_layer = {}
    for n, k in zip(names, keys):
        slot = joint.param_slots[n]
        lay = layers[k]
        lay.param_bytes += meta[slot].nbytes
        lay.grad_bytes += meta[joint.grad_slots[n]].nbytes
        shape = tuple(meta[slot].shape or ())
        if len(shape) == 2:
            lay.weights.append((int(shape[1] if slot in embedded else shape[0]), slot in embedded))
        module_layer[n.rpartition(".")[0]] = k
    produced, saved = {}, set()
    for node in g.nodes:
        ph = phase_of(node)
        if ph == "optimizer":
            continue
        for s in node.inputs:
            if ph == "backward" and produced.get(s) == "forward":
                saved.add(s)
        for s in node.outputs:
            produced[s] = ph
        path = node.module_path or ""
        k = _layer_key(path) or module_layer.get(path) or order[-1]
        layers.get(k, layers[order[-1]]).flops += float(node.flops or 0)
    total = sum(lay.flops for lay in layers.values())
    for lay in layers.values():
        lay.share = lay.flops / total if total > 0 else lay.param_bytes / max(1, sum(x.param_bytes for x in layers.values()))
    x = local[0]
    # token ids [rows, seq] are rows x seq tokens; features [rows, ..., width] are rows x ... tokens
    dims = list(x.shape[1:-1]) if x.is_floating_point() else list(x.shape[1:])
    return ModelShape(
        model=model_spec,
        param_bytes=sum(meta[joint.param_slots[n]].nbytes for n in names),
        grad_bytes=sum(meta[joint.grad_slots[n]].nbytes for n in names),
        state_bytes=sum(meta[s].nbytes for v in train.state_slots.values() for s in v),
        activation_bytes=sum(meta[s].nbytes for s in saved),
        tokens=int(x.shape[0]) * math.prod(int(d) for d in dims),
        layers=list(layers.values()), param_sizes=[meta[joint.grad_slots[n]].nbytes for n in names])
