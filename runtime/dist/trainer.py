"""One rank of a hybrid data-parallel training run.

    init_process_group(rank, world, "env://")              # runtime/comm.py (gloo on CPU)
    t = DistTrainer(model, inputs, ["torch:cpu", "sim:npu-a1"], [0.7, 0.3], rank, OptimizerSpec("sgd"))
    rec = t.step()        # this rank's rows -> gradients -> weighted all-reduce -> optimizer, every rank alike
    rec["loss"]           # the full batch's loss; rec["identical"]: every rank holds the same parameters

Each step: the rank's rows (split by ratio) run forward+backward on its backend; the gradients,
scaled by the rank's share of the rows, are summed over ranks through the backend's Communicator
(so the sum is the full-batch gradient of a mean loss); every rank applies the same optimizer to the
same sum. A digest of the parameters is compared across ranks after every step.

    DistTrainer(..., shard="optimizer")    # ZeRO-1: gradients all-reduced, each rank updates its shard, all-gather
    DistTrainer(..., shard="gradients")    # ZeRO-2: gradients reduced to their owner during backward (buckets.py)
    DistTrainer(..., shard="parameters")   # ZeRO-3: and each rank keeps only its shard of the parameters (zero3.py)
    DistTrainer(..., sync_bn=True)         # BatchNorm statistics over every rank's rows (sync_bn.py)

The shards are whole parameters (shard_parameters); rec["gradient_bytes"] and rec["optimizer_state_bytes"]
are what the rank holds of each from the reduction through the optimizer (ZeRO-2 divides both by ~world),
rec["parameter_bytes"] its parameters, rec["peak_rss_bytes"] the process's measured high-water mark so far.

One copy per rank: the parameters are host arrays (self.params, the captured graph's own copy) that the gradient
plan reads in place on torch:cpu, the optimizer updates in place and the collectives write in place; the model's
parameters are views of them. Nothing parameter-sized is made per step but the gradients and the optimizer's
per-parameter temporaries.
"""
from __future__ import annotations

import hashlib
import re
import time

import numpy as np
import torch

from .. import backends
from ..dtypes import to_numpy
from ..errors import ModelError, first_line
from ..hybrid import _Timer
from ..train.joint import capture_joint
from ..train.step import OptimizerSpec, build_train_graph
from .balance import Rebalancer, split_rows
from .host_collectives import all_reduce_, all_reduce_sum_, broadcast_, peak_rss_bytes, rss_bytes
from .split import GradientStep, OptimizerStep, _host
from .zero3 import ParameterGather, remote_tensor
from .thermal import ThermalModel


SCATTER_BUCKET_BYTES = 4 * 2 ** 20      # ZeRO-2/3's default bucket (--bucket-mb sets it)


class CollectiveFailed(ModelError):
    """A collective did not complete: a peer died, or the process group timed out."""


class DistTrainer:
    def __init__(self, model, inputs: tuple, specs: list[str], ratios: list[float], rank: int, opt: OptimizerSpec,
                 *, name: str = "", rebalance: Rebalancer | None = None, allow_fallback: bool = True,
                 overlap: bool = False, bucket_bytes: int | None = None, shard: str = "", sync_bn: bool = False):
        if not inputs or not all(hasattr(x, "shape") and len(x.shape) >= 1 for x in inputs):
            raise ModelError("hybrid training splits dim 0 of every input: the inputs must be tensors")
        self.model, self.inputs, self.name = model, tuple(inputs), name
        self.specs, self.rank, self.world = list(specs), rank, len(specs)
        self.backend = backends.resolve(specs[rank])
        self.comm = self.backend.comm
        self.opt_spec = opt
        self.allow_fallback = allow_fallback
        self.overlap, self.bucket_bytes = overlap, bucket_bytes     # --overlap: buckets.py (None: chosen there)
        self.shard = shard                                  # "optimizer": ZeRO-1, "gradients": ZeRO-2
        self.shards: list[list[str]] | None = None
        self.sync_bn = sync_bn and len(specs) > 1
        self.ratios = [r / sum(ratios) for r in ratios]
        self.rows = split_rows(self.ratios, int(self.inputs[0].shape[0]))
        self.rebalance = rebalance
        self.thermal = ThermalModel.of(self.backend)
        self.events: list[dict] = []
        self._steps: dict[int, GradientStep] = {}
        self.step_index = 0
        self.params: dict[str, np.ndarray] = {}      # the rank's one copy of its parameters (host arrays)
        first = self._gradient_step(self.rows[rank], with_optimizer=True)
        # rank 0's parameters are everyone's (DDP does the same): a factory that is not seeded still trains
        for n in sorted(self.params):
            self._collective("broadcast of the parameters", broadcast_, self.params[n], 0)
        first.set_parameters(self.params)
        self.sizes = {n: int(v.size) for n, v in self.params.items()}
        self.remote: dict[str, torch.Tensor] = {}      # ZeRO-3: the parameters other ranks keep
        if shard == "parameters":
            self._keep_only_my_shard(first)
        # the model's parameters become views of the same arrays (a capture for a new row count still reads
        # them), so the process keeps one copy, not the model's beside the trainer's
        for n, p in self.model.named_parameters():
            if n in self.params and tuple(p.shape) == self.params[n].shape:
                p.data = torch.from_numpy(self.params[n])
            elif n in self.remote:
                p.data = self.remote[n]
        # clocks aligned at start: every rank leaves the barrier together and counts from rank 0's clock
        self._collective("barrier at start", self.comm.barrier)
        self.t0 = time.perf_counter_ns()
        base = self._collective("clock alignment", self.comm.broadcast,
                                self.backend.memory.to_device(np.array([self.t0], np.int64)), 0)
        self.base = int(np.asarray(self.backend.memory.to_host(base))[0])

    def _keep_only_my_shard(self, gs: GradientStep) -> None:
        """ZeRO-3: the other ranks' parameters leave this process; the plan reads tensors that a gather fills
        while an op needs them (zero3.py)."""
        mine = set(self.shards[self.rank])
        self.owner = {n: r for r, names in enumerate(self.shards) for n in names}
        for n in [n for n in self.params if n in self.owner and n not in mine]:
            self.remote[n] = remote_tensor(self.params[n].shape, gs.plan.constants[gs.param_slots[n]].dtype)
            del self.params[n]
        gs.bind_remote(self.remote)
        self.gather = ParameterGather(gs, {n: gs.plan.constants[gs.param_slots[n]] for n in self.owner},
                                      self.owner, self.rank)

    # --- pieces --------------------------------------------------------------------------
    def _local(self, rows: list[int], batch: tuple) -> tuple:
        start = sum(rows[:self.rank])
        return tuple(x[start:start + rows[self.rank]] for x in batch)

    def _gradient_step(self, n: int, with_optimizer: bool = False) -> GradientStep:
        if n not in self._steps:
            local = self._local(self.rows, self.inputs) if n == self.rows[self.rank] else \
                tuple(x[:n] for x in self.inputs)
            train = build_train_graph(capture_joint(self.model, local, self.name), self.opt_spec)
            if not self.params:      # the captured copy of the parameters becomes the rank's only one
                consts = train.graph.constant_slots
                self.params = {name: _host(consts[s]) for name, s in train.joint.param_slots.items()}
            step = GradientStep(train, self.backend, allow_fallback=self.allow_fallback, params=self.params)
            if with_optimizer:
                if self.shard:
                    self.shards = shard_parameters(train, self.world)
                self.optimizer = OptimizerStep(train, shard=self.shards[self.rank] if self.shards else None,
                                               params=self.params)
            elif self._steps:
                step.set_parameters(self.params)
            self._steps[n] = step
        return self._steps[n]

    def finish(self) -> None:
        """Wait for every rank: a rank that tears its group down while a peer is still in the last
        all-reduce makes gloo's pair threads throw on the closed socket, and that aborts the peer."""
        self._collective("barrier at the end", self.comm.barrier)

    def _collective(self, what: str, fn, *args):
        try:
            return fn(*args)
        except Exception as e:       # gloo raises RuntimeError/DistBackendError on a dead peer or a timeout
            raise CollectiveFailed(f"{what} failed at step {self.step_index + 1}: {_gloo_message(e)} "
                                   "(another rank died or stopped answering)") from e

    def _gather_shards(self) -> None:
        """Each parameter's new value from the rank that updated it into every rank's array, in place (one
        broadcast per parameter: no buffer the size of the parameters)."""
        for r, names in enumerate(self.shards):
            for n in names:
                self._collective("all-gather of the parameter shards", broadcast_, self.params[n], r)

    def _all_reduce(self, what: str, host: np.ndarray) -> np.ndarray:
        native = self.backend.memory.to_device(host)
        return np.asarray(self.backend.memory.to_host(self._collective(what, self.comm.all_reduce, native)))

    def _sync_bn(self, gs: GradientStep, rows: list[int]) -> list:
        """--sync-bn: the hook that puts the whole batch's BatchNorm statistics into every rank's step (none where
        the step has no BatchNorm: every rank runs the same graph, so every rank decides alike)."""
        if not self.sync_bn:
            return []
        from .sync_bn import SyncBatchNorm, has_batch_norm
        if not has_batch_norm(gs.plan):
            return []

        def all_reduce(t: torch.Tensor) -> None:
            self._collective("all-reduce of the BatchNorm statistics", all_reduce_sum_, t)
        return [SyncBatchNorm(rows[self.rank] / sum(rows), all_reduce)]

    def _device_seconds(self, gs: GradientStep, local: tuple, *hooks):
        """Run the gradient step once; (loss, grads, device seconds on the backend's clock, slowdown)."""
        timer = _Timer()
        with gs.executor.hooked(timer, *hooks):
            # the buckets' set fills while backward runs: the gradients they freed are not read back
            loss, grads = gs.run(local, taken=next((h.taken for h in hooks if hasattr(h, "taken")), ()))
        seconds = timer.ns / 1e9
        slowdown = self.thermal.advance(seconds) if self.thermal else 1.0
        return loss, grads, seconds * slowdown, slowdown

    # --- calibration and steps --------------------------------------------------------------
    def calibrate(self, probe_steps: int = 1) -> dict:
        """--hybrid auto: time `probe_steps` gradient steps on every rank at the current split (the
        parameters do not change) and set the shares in proportion to the measured throughput."""
        gs = self._gradient_step(self.rows[self.rank])
        seconds = 0.0
        for _ in range(max(1, probe_steps)):
            seconds += self._device_seconds(gs, self._local(self.rows, self.inputs), *self._sync_bn(gs, self.rows))[2]
        times = np.zeros(self.world, np.float64)
        times[self.rank] = seconds / max(1, probe_steps)
        times = self._all_reduce("all-reduce of the probe times", times)
        speeds = [n / t if t > 0 else 0.0 for n, t in zip(self.rows, times)]
        from .balance import ratios_from_speed
        old = list(self.ratios)
        self.ratios = ratios_from_speed(speeds)
        self.rows = split_rows(self.ratios, sum(self.rows))
        self._gradient_step(self.rows[self.rank])
        fastest = max(range(self.world), key=lambda r: speeds[r])
        reason = ("probe: " + ", ".join(f"rank {r} ({self.specs[r]}) {speeds[r]:.4g} rows/s" for r in range(self.world))
                  + f"; rank {fastest} is {speeds[fastest] / min(speeds):.2f}x the slowest")
        event = {"kind": "calibrate", "step": 0, "rank": self.rank, "old_ratios": [round(r, 4) for r in old],
                 "new_ratios": [round(r, 4) for r in self.ratios], "rows": self.rows,
                 "probe_seconds": [float(t) for t in times], "rows_per_second": speeds, "reason": reason}
        self.events.append(event)
        return event

    def step(self, batch: tuple | None = None) -> dict:
        """One data-parallel step over the whole batch; returns this step's record."""
        batch = self.inputs if batch is None else tuple(batch)
        t_start = time.perf_counter()
        marks = [self.now()]
        rows = list(self.rows)
        weight = rows[self.rank] / sum(rows)
        gs = self._gradient_step(rows[self.rank])
        names = gs.names
        buckets = None
        scatter = self.shard in ("gradients", "parameters")
        if self.overlap or scatter:
            # ZeRO-2 reduces bucket by bucket during backward either way, so no rank ever holds all its
            # gradients; --overlap lets each bucket go while backward runs, without it each waits
            from .buckets import GradientBuckets, auto_bucket_bytes
            sizes = {n: self.sizes[n] for n in names}
            cap = self.bucket_bytes or auto_bucket_bytes(sizes)
            if scatter and not self.bucket_bytes:
                # a bucket is held twice while it goes out (the scaled copies and the send buffer): ZeRO-2 exists
                # to hold less than all the gradients, so its buckets stay small unless --bucket-mb says otherwise
                cap = min(cap, SCATTER_BUCKET_BYTES)
            buckets = GradientBuckets(gs, weight, cap, sizes, shards=self.shards if scatter else None,
                                      rank=self.rank, wait=not self.overlap)
        hooks = ([self.gather] if self.remote else []) + ([buckets] if buckets else []) + self._sync_bn(gs, rows)
        loss, grads, device_s, slowdown = self._device_seconds(gs, self._local(rows, batch), *hooks)
        t_comm = time.perf_counter()
        marks.append(self.now())
        # full: name -> reduced gradient of every parameter this rank receives (ZeRO-2: its shard's only)
        if buckets is not None:      # most buckets went out during backward: wait for the rest
            full, exposed = self._collective("reduction of the gradient buckets", buckets.finish, grads)
        else:          # in place, in buckets of at most DDP's 25 MiB
            self._collective("all-reduce of the gradients", all_reduce_, [grads[n] for n in names], weight)
            exposed = time.perf_counter() - t_comm
            full = grads
        gradient_bytes = sum(int(v.nbytes) for v in full.values())
        if self.shards:          # ZeRO: only this rank's shard is updated here; the others' gradients go now
            mine = set(self.shards[self.rank])
            full = {n: g for n, g in full.items() if n in mine}
        del grads
        # loss, and every rank's time, slowdown and temperature in one small float64 sum: each rank
        # fills its own slots, so every rank learns them all and takes the same re-balancing decision
        w = self.world
        info = np.zeros(1 + 3 * w, np.float64)
        info[0], info[1 + self.rank], info[1 + w + self.rank] = loss * weight, device_s, slowdown
        info[1 + 2 * w + self.rank] = self.thermal.temperature if self.thermal else np.nan
        info = self._all_reduce("all-reduce of the loss", info)
        comm_s = time.perf_counter() - t_comm
        marks.append(self.now())
        self.optimizer.run(full)     # in place: self.params holds the new values
        del full
        if self.shards and not self.remote:      # ZeRO-1/2: each rank updated its shard, everyone gets everyone's
            self._gather_shards()
        gs.set_parameters(self.params)      # a backend with its own copy (torch:cpu reads self.params itself)
        marks.append(self.now())
        digest = self.digest()
        digests = self._collective("parameter check", self.comm.all_gather,
                                   self.backend.memory.to_device(np.array([digest], np.int64)))
        digests = [f"{int(np.asarray(self.backend.memory.to_host(d))[0]) & (2 ** 64 - 1):016x}" for d in digests]
        if self.remote:          # ZeRO-3: each rank holds its own shard; the job's parameters are all of them
            combined = hashlib.blake2b("".join(digests).encode(), digest_size=8).hexdigest()
            digests = [combined] * self.world
        identical = len(set(digests)) == 1
        marks.append(self.now())
        spans = _spans(marks, device_s, "reduce_scatter" if scatter else "all_reduce")
        times = [float(t) for t in info[1:1 + w]]
        record = {"kind": "step", "step": self.step_index, "rank": self.rank, "world_size": self.world,
                  "backend": self.specs[self.rank], "loss": float(info[0]), "local_loss": loss, "rows": rows,
                  "ratios": [round(r, 4) for r in self.ratios], "device_seconds": times,
                  "comm_seconds": comm_s, "exposed_gradient_comm_seconds": exposed,
                  "buckets": buckets.buckets if buckets else 1, "bucket_bytes": cap if buckets else None,
                  "optimizer_state_bytes": self.optimizer.state_bytes(), "gradient_bytes": gradient_bytes,
                  "parameter_bytes": sum(int(v.nbytes) for v in self.params.values()),
                  "peak_rss_bytes": peak_rss_bytes(), "rss_bytes": rss_bytes(),
                  "step_seconds": time.perf_counter() - t_start,
                  "digest": digests[self.rank], "digests": digests, "identical": identical, "spans": spans}
        if self.thermal:
            record["thermal"] = {**self.thermal.sample(), "slowdown": slowdown}
        self.step_index += 1
        if self.rebalance is not None:
            change = self.rebalance.observe(record["step"], rows, times, _why(info, w))
            if change is not None:
                self.ratios, self.rows = change.new, change.rows
                self.events.append(change.as_event())
                record["rebalance"] = change.as_event()
        return record

    def now(self) -> int:
        """Nanoseconds on the run's aligned clock (rank 0's monotonic clock at the start barrier)."""
        return time.perf_counter_ns() - self.t0 + self.base

    def digest(self) -> int:
        """A 64-bit fingerprint of the parameters this rank holds (ZeRO-3: its shard)."""
        return digest_of(self.params)

    def parameters(self) -> dict[str, np.ndarray]:
        """Every parameter (name -> host array). ZeRO-3: gathered from their owners, a collective every rank
        calls."""
        if not self.remote:
            return dict(self.params)
        out = {}
        for r, names in enumerate(self.shards):
            for n in names:
                t = self.gather.tensors[n]
                out[n] = self.params[n].copy() if n in self.params else \
                    np.empty(tuple(t.shape), to_numpy(t.dtype))
                self._collective("gather of the parameters", broadcast_, out[n], r)
        out.update({n: v for n, v in self.params.items() if n not in out})
        return out

    def parameter_meta(self) -> dict[str, np.ndarray]:
        """Every parameter's shape and dtype (as an array of no memory): what a checkpoint is checked against."""
        out = {n: np.broadcast_to(np.zeros((), v.dtype), v.shape) for n, v in self.params.items()}
        for n, t in self.remote.items():
            out[n] = np.broadcast_to(np.zeros((), to_numpy(t.dtype)), tuple(t.shape))
        return out

    def load_parameters(self, params: dict[str, np.ndarray]) -> None:
        """Values (a checkpoint's) copied into the rank's parameters, which every plan reads."""
        for n, v in params.items():
            if n in self.params:
                np.copyto(self.params[n], np.asarray(v).reshape(self.params[n].shape))
        for gs in self._steps.values():
            gs.set_parameters(self.params)


def digest_of(params: dict[str, np.ndarray]) -> int:
    """A 64-bit fingerprint of every array's bytes, equal on two ranks only if the bits are."""
    h = hashlib.blake2b(digest_size=8)
    for n in sorted(params):
        h.update(np.ascontiguousarray(params[n]).tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)


def shard_parameters(train, world: int) -> list[list[str]]:
    """ZeRO's partition (stages 1 and 2): parameters to ranks, largest first onto the least loaded rank (the same on every
    rank: it depends only on the graph)."""
    joint = train.joint
    names = [n for n in joint.param_slots if n in joint.grad_slots]
    sizes = {n: int(np.prod(joint.graph.slot_meta[joint.param_slots[n]].shape or (1,))) for n in names}
    shards: list[list[str]] = [[] for _ in range(world)]
    load = [0] * world
    for n in sorted(names, key=lambda n: (-sizes[n], names.index(n))):
        r = min(range(world), key=lambda r: (load[r], r))
        shards[r].append(n)
        load[r] += sizes[n]
    return [[n for n in names if n in set(s)] for s in shards]


def _spans(marks: list[int], device_s: float, reduction: str = "all_reduce") -> list[list]:
    """The step's phases on the aligned clock. The compute span lasts the device's time (a sim chip's
    simulated time, not the host's numpy time); each later span keeps its measured length and starts
    no earlier than the one before ends, as a rank does its phases one after another."""
    out, end = [], marks[0]
    for i, name in enumerate(("forward_backward", reduction, "optimizer", "all_gather")):
        length = int(device_s * 1e9) if i == 0 else marks[i + 1] - marks[i]
        start = max(marks[i], end)
        out.append([name, start, start + length])
        end = start + length
    return out


def _gloo_message(e: Exception) -> str:
    """gloo's first sentence without its source path: 'Connection closed by peer [127.0.0.1]:46746'."""
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", first_line(e))
    return text.split(". ")[0].rstrip(".")


def _why(info: np.ndarray, w: int) -> list[str]:
    """Each rank's hardware state as a reason: throttling (with its temperature) when it ran slowed."""
    out = []
    for r in range(w):
        slowdown, temp = info[1 + w + r], info[1 + 2 * w + r]
        out.append(f"throttled at {temp:.0f} C, running {slowdown:g}x slower" if slowdown > 1 else "")
    return out
