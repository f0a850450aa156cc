"""ZeRO-3 (`--shard parameters`, FSDP-style): a rank keeps only its shard of the parameters; each other parameter
is gathered from its owner just before an op reads it and freed after the last op of the phase that reads it.

    gather = ParameterGather(gradient_step, remote, owner, rank)    # remote: name -> tensor (storage freed)
    with gradient_step.executor.hooked(gather, ...):
        gradient_step.run(local)

How a parameter is freed while views of it live on: like FSDP, by resizing its storage to nothing
(`untyped_storage().resize_(0)`), not by dropping the tensor. AOTAutograd's joint graph keeps views of a weight
from the forward to the backward (the `t` of a linear's weight); they share the storage, so the memory goes while
they still exist, and the re-gather before the backward writes the values back into that very storage.

When: every op's tensor arguments are checked against the parameters' storages. A parameter whose storage is
freed is gathered (one broadcast from its owner, in which every rank takes part: the owner's copy is the one sent);
after each op, a gathered parameter that no later op of the same phase reads (through any slot that views it)
is freed. Every rank runs the same plan (every rank on a torch backend: the job refuses others), so every rank
takes the same decisions in the same order and the collectives pair up.
"""
from __future__ import annotations

import bisect

import torch
import torch.distributed as dist

from ..train.joint import phase_of


class ParameterGather:
    def __init__(self, gs, tensors: dict[str, torch.Tensor], owner: dict[str, int], rank: int):
        """tensors: every parameter's tensor as the plan reads it (this rank's own shard included; the others'
        storages freed); owner: name -> the rank that keeps it."""
        self.tensors, self.owner, self.rank = tensors, owner, rank
        self.by_storage = {t.untyped_storage()._cdata: n for n, t in tensors.items()}
        self.nbytes = {n: t.numel() * t.element_size() for n, t in tensors.items()}
        steps = gs.plan.steps
        self.phase = [phase_of(st.node) for st in steps]
        self.reads: dict[int, list[int]] = {}             # slot -> the steps that read it, in order
        for i, st in enumerate(steps):
            for s in st.node.inputs:
                self.reads.setdefault(s, []).append(i)
        slot_of = {s: n for n, s in gs.param_slots.items() if n in tensors}
        self.base_aliases = {n: {s} for s, n in slot_of.items()}
        self.gathered: set[str] = set()
        self.gathers = 0

    def on_run_start(self, info) -> None:
        self.aliases = {n: set(a) for n, a in self.base_aliases.items()}
        self.gathered = set()

    def before_op(self, call) -> None:
        for a in _tensors(call.inputs):
            name = self.by_storage.get(a.untyped_storage()._cdata)
            if name is not None and name not in self.gathered:
                self._gather(name)

    def after_op(self, call) -> None:
        outs = call.outputs if call.node.multi_output else [call.outputs]
        for slot, value in zip(call.node.outputs, outs):      # views of a parameter read it later too
            if isinstance(value, torch.Tensor):
                name = self.by_storage.get(value.untyped_storage()._cdata)
                if name is not None:
                    self.aliases[name].add(slot)
        i = call.seq
        for name in sorted(self.gathered):
            nxt = min((k for k in (self._next_read(s, i) for s in self.aliases[name]) if k is not None), default=None)
            if nxt is None or self.phase[nxt] != self.phase[i]:
                self._free(name)

    def on_run_end(self, info, error) -> None:
        for name in sorted(self.gathered):
            self._free(name)

    def _next_read(self, slot: int, i: int):
        reads = self.reads.get(slot, [])
        k = bisect.bisect_right(reads, i)
        return reads[k] if k < len(reads) else None

    def _gather(self, name: str) -> None:
        t = self.tensors[name]
        if self.owner[name] != self.rank:
            t.untyped_storage().resize_(self.nbytes[name])
        dist.broadcast(t, self.owner[name])
        self.gathered.add(name)
        self.gathers += 1

    def _free(self, name: str) -> None:
        if self.owner[name] != self.rank:
            self.tensors[name].untyped_storage().resize_(0)
        self.gathered.discard(name)


def remote_tensor(shape, dtype) -> torch.Tensor:
    """A parameter this rank does not keep: its tensor, with no memory until a gather fills it."""
    t = torch.empty(tuple(shape), dtype=dtype)
    t.untyped_storage().resize_(0)
    return t


def _tensors(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors(a)
