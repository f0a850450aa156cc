"""Gradients all-reduced in buckets while backward runs, the way DDP's reducer does it.

    buckets = GradientBuckets(gradient_step, weight=rows / total, cap_bytes=25 * 2**20)
    with gradient_step.executor.hooked(buckets):
        loss, grads = gradient_step.run(local)       # each bucket's all-reduce starts as soon as it fills
    reduced, exposed_s = buckets.finish(grads)       # the rest go now; exposed_s: the wait after backward

An executor hook sees every gradient the moment the op that makes it ends (backward runs from the loss
towards the inputs, so the last layers' gradients come first). Each one, scaled by the rank's share of
the rows as the unbucketed path scales them, joins the open bucket; a full bucket is handed to gloo as
an async all-reduce (torch.distributed's work handle) and backward carries on while gloo's threads send
it. The sums are the same elementwise float32 sums as one flat all-reduce, so results do not change.

    GradientBuckets(gradient_step, weight, cap_bytes, sizes, shards=shards, rank=rank)   # --shard gradients

With shards (ZeRO-2/3) a bucket holds the parameters of one owner and is reduced to that owner: each rank
receives the sum of only its own parameters' gradients (together the buckets are a reduce-scatter, without
padding each rank's part to the longest), and a rank keeps none of another's. The executor's own gradient is
freed as soon as its scaled copy is in the bucket (its storage resized to nothing: it is a graph output, held
to the end of the run otherwise), so no rank ever holds all its gradients at once (DeepSpeed's stage 2 reduces
and frees its buckets the same way). `wait`: each bucket completes before backward goes on (no --overlap).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..comm import all_reduce_async
from .host_collectives import reduce_async


DDP_BUCKET_BYTES = 25 * 2 ** 20        # DDP's bucket_cap_mb
AUTO_BUCKETS = 4                        # --bucket-mb not given: the gradients in about this many buckets


def auto_bucket_bytes(sizes: dict[str, int]) -> int:
    """The bucket size when none is asked: a quarter of the model's float32 gradients, at most DDP's 25 MiB.
    DDP's 25 MiB holds the whole of a small model's gradients (demo:gpt's 17 MB): one bucket, sent after
    backward, overlaps nothing."""
    total = 4 * sum(int(n) for n in sizes.values())
    return max(1, min(DDP_BUCKET_BYTES, -(-total // AUTO_BUCKETS)))


class GradientBuckets:
    def __init__(self, gs, weight: float, cap_bytes: int, sizes: dict[str, int], *,
                 shards: list[list[str]] | None = None, rank: int = 0, wait: bool = False):
        """shards: every rank's parameter names (--shard gradients); the buckets are then reduce-scattered.
        wait: each bucket's collective completes before backward goes on (ZeRO-2 without --overlap)."""
        refs = gs.plan.output_refs
        self.slot_name = {refs[1 + i].slot: n for i, n in enumerate(gs.names)}
        self.names = list(gs.names)
        self.weight = np.float32(weight)
        self.weight_t = torch.tensor(self.weight)
        # NOTE: buckets are fixed up front, in reverse parameter order (DDP's rule), and go out in that
        # order: ranks on different backends finish their gradients in different orders, and an
        # all-reduce that two ranks call with different buckets mixes the wrong gradients (or hangs)
        self.shards, self.rank = shards, rank
        self.owner = {n: r for r, shard in enumerate(shards or []) for n in shard}
        # sharded, a bucket holds one owner's parameters and is reduced to that owner: no part padded to another
        # rank's, and a rank keeps nothing of a bucket it does not own
        self.plan: list[list[str]] = [[]]
        filled = 0
        for name in reversed(self.names):
            if self.plan[-1] and (filled >= max(1, int(cap_bytes)) or
                                  self.owner.get(name) != self.owner.get(self.plan[-1][0])):
                self.plan.append([])
                filled = 0
            self.plan[-1].append(name)
            filled += 4 * int(sizes[name])
        self.ready: dict[str, np.ndarray] = {}     # scaled copies of the gradients not yet sent
        self.seen: set[str] = set()
        self.flights: list[tuple] = []            # (PendingReduce, [(name, size)]) in bucket order, not yet done
        self.sent = 0                             # buckets handed to gloo
        self.reduced: dict[str, np.ndarray] = {}  # name -> its sum over the ranks, from the buckets done
        self.wait = wait
        self.shapes: dict[str, tuple] = {}
        # gradients whose memory was handed back once copied into their bucket (GradientStep.run skips them):
        # a gradient is a graph output, so the executor holds it to the end of the run otherwise, and every
        # rank would hold all its gradients at once -- what ZeRO-2 exists to avoid
        self.taken: set[str] = set()
        self.last_read: dict[int, int] = {}
        for i, st in enumerate(gs.plan.steps):
            for slot in st.node.inputs:
                self.last_read[slot] = i
        self.storage_slots: dict[int, set[int]] = {}    # storage -> the slots whose values view it (this run)

    def after_op(self, call) -> None:
        node = call.node
        values = call.outputs if node.multi_output else [call.outputs]
        for slot, value in zip(node.outputs, values):
            if isinstance(value, torch.Tensor):
                self.storage_slots.setdefault(_storage(value), set()).add(slot)
        for slot, value in zip(node.outputs, values):
            name = self.slot_name.get(slot)
            if name is None or name in self.seen:
                continue
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                # scaled by torch (the same float32 products as numpy's): a tensor whose memory numpy has viewed
                # can no longer be freed, and this one is, below
                self._add(name, (value.detach().reshape(-1).to(torch.float32) * self.weight_t).numpy(), tuple(value.shape))
                self._free(name, slot, value, call.seq)
            else:
                self._add(name, np.asarray(call.backend.memory.to_host(value)))

    def _free(self, name: str, slot: int, value, seq: int) -> None:
        """Hand the gradient's memory back now that its bucket holds a copy: only a torch tensor that is its
        storage's whole, and whose storage no later op reads through any slot (a view made earlier included)."""
        if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
            return
        storage = value.untyped_storage()
        if storage.nbytes() != value.numel() * value.element_size():
            return
        if any(self.last_read.get(s, -1) > seq for s in self.storage_slots.get(_storage(value), {slot})):
            return
        try:
            storage.resize_(0)
        except RuntimeError:          # memory the tensor does not own (from numpy, say): left as it is
            return
        self.taken.add(name)

    def _add(self, name: str, grad: np.ndarray, shape: tuple | None = None) -> None:
        """shape given: `grad` is already the flat scaled copy."""
        self.shapes[name] = grad.shape if shape is None else shape
        # a copy, scaled as the unbucketed path scales it: the op's buffer may be reused by a later op
        self.ready[name] = grad if shape is not None else \
            np.ascontiguousarray(grad, dtype=np.float32).reshape(-1) * self.weight
        self.seen.add(name)
        while self.sent < len(self.plan) and all(n in self.seen for n in self.plan[self.sent]):
            names = self.plan[self.sent]
            self.sent += 1
            if self.shards is None:
                flat = torch.from_numpy(np.concatenate([self.ready[n] for n in names]))
                self.flights.append((all_reduce_async(flat), [(n, self.ready[n].size) for n in names]))
            else:
                flat = self.ready[names[0]] if len(names) == 1 else np.concatenate([self.ready[n] for n in names])
                owner = self.owner[names[0]]
                mine = [(n, self.ready[n].size) for n in names] if owner == self.rank else []
                self.flights.append((reduce_async(torch.from_numpy(flat), owner), mine))
            for n in names:          # copied into the send buffer: this rank keeps none of them
                del self.ready[n]
            # a bucket done (at once without overlap) leaves its buffers: only this rank's sums are kept
            while self.flights and (self.wait or self.flights[0][0].work.is_completed()):
                self._collect(*self.flights.pop(0))

    def _collect(self, pending, parts) -> None:
        """A finished bucket's sums of this rank's parameters (views of the result, which is let go whole when
        it holds none of them: a reduce-scatter pads every rank's part to the longest)."""
        if not parts:
            pending.wait()
            return
        total = pending.wait().numpy()
        at = 0
        for name, size in parts:
            self.reduced[name] = total[at:at + size].reshape(self.shapes[name])
            at += size

    @property
    def buckets(self) -> int:
        return len(self.plan)

    def finish(self, grads: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        """Send what is left (gradients no op wrote, e.g. outputs that are graph inputs), wait for every
        bucket; (name -> reduced gradient shaped like grads[name], seconds spent waiting). With shards,
        only this rank's parameters are in it."""
        for name in self.names:
            if name not in self.seen:
                self._add(name, grads[name])
        t0 = time.perf_counter()
        while self.flights:
            self._collect(*self.flights.pop(0))
        out, self.reduced = self.reduced, {}
        return out, time.perf_counter() - t0


def _storage(t: torch.Tensor) -> int:
    """An id of the tensor's storage (views of one storage share it)."""
    return t.untyped_storage().data_ptr() or id(t)
