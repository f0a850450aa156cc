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

With shards (ZeRO-2) each full bucket is reduce-scattered instead: split by the shards' owners (pack_shards'
layout), each rank receives the sum of only its own parameters' gradients, and the bucket's other gradients
are dropped once the bucket is handed to gloo (DeepSpeed's stage 2 reduces its buckets the same way).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..comm import all_reduce_async, reduce_scatter_async
from .split import pack_shards


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
                 shards: list[list[str]] | None = None, rank: int = 0):
        """shards: every rank's parameter names (--shard gradients); the buckets are then reduce-scattered."""
        refs = gs.plan.output_refs
        self.slot_name = {refs[1 + i].slot: n for i, n in enumerate(gs.names)}
        self.names = list(gs.names)
        self.weight = np.float32(weight)
        # NOTE: buckets are fixed up front, in reverse parameter order (DDP's rule), and go out in that
        # order: ranks on different backends finish their gradients in different orders, and an
        # all-reduce that two ranks call with different buckets mixes the wrong gradients (or hangs)
        self.plan: list[list[str]] = [[]]
        filled = 0
        for name in reversed(self.names):
            if filled >= max(1, int(cap_bytes)):
                self.plan.append([])
                filled = 0
            self.plan[-1].append(name)
            filled += 4 * int(sizes[name])
        self.shards, self.rank = shards, rank
        self.owner = {n: r for r, shard in enumerate(shards or []) for n in shard}
        self.ready: dict[str, np.ndarray] = {}     # scaled copies of the gradients not yet sent
        self.seen: set[str] = set()
        self.flights: list[tuple] = []            # (PendingReduce, [(name, size)]) in bucket order

    def after_op(self, call) -> None:
        node = call.node
        values = call.outputs if node.multi_output else [call.outputs]
        for slot, value in zip(node.outputs, values):
            name = self.slot_name.get(slot)
            if name is not None and name not in self.seen:
                self._add(name, np.asarray(call.backend.memory.to_host(value)))

    def _add(self, name: str, grad: np.ndarray) -> None:
        # a copy, scaled as the unbucketed path scales it: the op's buffer may be reused by a later op
        self.ready[name] = np.ascontiguousarray(grad, dtype=np.float32).reshape(-1) * self.weight
        self.seen.add(name)
        while len(self.flights) < len(self.plan) and all(n in self.seen for n in self.plan[len(self.flights)]):
            names = self.plan[len(self.flights)]
            if self.shards is None:
                flat = torch.from_numpy(np.concatenate([self.ready[n] for n in names]))
                self.flights.append((all_reduce_async(flat), [(n, self.ready[n].size) for n in names]))
            else:
                parts = [[n for n in names if self.owner[n] == r] for r in range(len(self.shards))]
                buf, _ = pack_shards(parts, self.ready)
                mine = [(n, self.ready[n].size) for n in parts[self.rank]]
                self.flights.append((reduce_scatter_async(torch.from_numpy(buf)), mine))
            for n in names:          # copied into the send buffer: this rank keeps none of them
                del self.ready[n]

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
        out = {}
        for pending, parts in self.flights:
            total = pending.wait().numpy()
            at = 0
            for name, size in parts:
                out[name] = total[at:at + size].reshape(grads[name].shape)
                at += size
        return out, time.perf_counter() - t0
