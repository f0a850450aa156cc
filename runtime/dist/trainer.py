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
    DistTrainer(..., shard="gradients")    # ZeRO-2: gradients reduce-scattered, each rank keeps only its shard's

The shards are whole parameters (shard_parameters); rec["gradient_bytes"] and rec["optimizer_state_bytes"]
are what the rank holds of each from the reduction through the optimizer (ZeRO-2 divides both by ~world).
"""
from __future__ import annotations

import hashlib
import re
import time

import numpy as np

from .. import backends
from ..errors import ModelError, first_line
from ..hybrid import _Timer
from ..train.joint import capture_joint
from ..train.step import OptimizerSpec, build_train_graph
from .balance import Rebalancer, split_rows
from .split import GradientStep, OptimizerStep, pack_shards, unpack_shard
from .thermal import ThermalModel


class CollectiveFailed(ModelError):
    """A collective did not complete: a peer died, or the process group timed out."""


class DistTrainer:
    def __init__(self, model, inputs: tuple, specs: list[str], ratios: list[float], rank: int, opt: OptimizerSpec,
                 *, name: str = "", rebalance: Rebalancer | None = None, allow_fallback: bool = True,
                 overlap: bool = False, bucket_bytes: int | None = None, shard: str = ""):
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
        self.ratios = [r / sum(ratios) for r in ratios]
        self.rows = split_rows(self.ratios, int(self.inputs[0].shape[0]))
        self.rebalance = rebalance
        self.thermal = ThermalModel.of(self.backend)
        self.events: list[dict] = []
        self._steps: dict[int, GradientStep] = {}
        self.step_index = 0
        first = self._gradient_step(self.rows[rank], with_optimizer=True)
        # rank 0's parameters are everyone's (DDP does the same): a factory that is not seeded still trains
        params = self._broadcast(self.optimizer.parameters())
        self.optimizer.set_parameters(params)
        first.set_parameters(params)
        self.params = params
        # clocks aligned at start: every rank leaves the barrier together and counts from rank 0's clock
        self._collective("barrier at start", self.comm.barrier)
        self.t0 = time.perf_counter_ns()
        base = self._collective("clock alignment", self.comm.broadcast,
                                self.backend.memory.to_device(np.array([self.t0], np.int64)), 0)
        self.base = int(np.asarray(self.backend.memory.to_host(base))[0])

    # --- pieces --------------------------------------------------------------------------
    def _local(self, rows: list[int], batch: tuple) -> tuple:
        start = sum(rows[:self.rank])
        return tuple(x[start:start + rows[self.rank]] for x in batch)

    def _gradient_step(self, n: int, with_optimizer: bool = False) -> GradientStep:
        if n not in self._steps:
            local = self._local(self.rows, self.inputs) if n == self.rows[self.rank] else \
                tuple(x[:n] for x in self.inputs)
            train = build_train_graph(capture_joint(self.model, local, self.name), self.opt_spec)
            step = GradientStep(train, self.backend, allow_fallback=self.allow_fallback)
            if with_optimizer:
                if self.shard:
                    self.shards = shard_parameters(train, self.world)
                self.optimizer = OptimizerStep(train, shard=self.shards[self.rank] if self.shards else None)
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

    def _broadcast(self, params: dict) -> dict:
        names = list(params)
        flat = np.concatenate([params[n].reshape(-1) for n in names]).astype(np.float32)
        flat = self.backend.memory.to_host(self._collective("broadcast of the parameters", self.comm.broadcast,
                                                            self.backend.memory.to_device(flat), 0))
        out, at = {}, 0
        for n in names:
            size = params[n].size
            out[n] = np.asarray(flat[at:at + size]).reshape(params[n].shape).astype(params[n].dtype)
            at += size
        return out

    def _gather_shards(self, params: dict) -> dict:
        """All-gather the shards' new values (padded to the largest shard) into every parameter."""
        buf, part = pack_shards(self.shards, {n: params[n] for n in params})
        mine = buf[self.rank * part:(self.rank + 1) * part]
        parts = self._collective("all-gather of the parameter shards", self.comm.all_gather,
                                 self.backend.memory.to_device(mine))
        shapes = {n: params[n].shape for n in params}
        out = dict(params)
        for r, names in enumerate(self.shards):
            for n, v in unpack_shard(np.asarray(self.backend.memory.to_host(parts[r])), names, shapes).items():
                out[n] = v.astype(params[n].dtype)
        return out

    def _reduce_scatter(self, grads: dict, weight: float) -> dict:
        """ZeRO-2 without buckets: every rank's scaled gradients in one buffer laid out by shard; each rank
        receives the sum of its own shard only (name -> reduced gradient)."""
        buf, _ = pack_shards(self.shards, grads)
        buf *= np.float32(weight)
        mine = self._collective("reduce-scatter of the gradients", self.comm.reduce_scatter,
                                self.backend.memory.to_device(buf))
        return unpack_shard(np.asarray(self.backend.memory.to_host(mine)), self.shards[self.rank],
                            {n: grads[n].shape for n in grads})

    def _all_reduce(self, what: str, host: np.ndarray) -> np.ndarray:
        native = self.backend.memory.to_device(host)
        return np.asarray(self.backend.memory.to_host(self._collective(what, self.comm.all_reduce, native)))

    def _device_seconds(self, gs: GradientStep, local: tuple, *hooks):
        """Run the gradient step once; (loss, grads, device seconds on the backend's clock, slowdown)."""
        timer = _Timer()
        with gs.executor.hooked(timer, *hooks):
            loss, grads = gs.run(local)
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
            seconds += self._device_seconds(gs, self._local(self.rows, self.inputs))[2]
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
        scatter = self.shard == "gradients"
        if self.overlap:
            from .buckets import GradientBuckets, auto_bucket_bytes
            sizes = {n: self.params[n].size for n in names}
            cap = self.bucket_bytes or auto_bucket_bytes(sizes)
            buckets = GradientBuckets(gs, weight, cap, sizes,
                                      shards=self.shards if scatter else None, rank=self.rank)
        loss, grads, device_s, slowdown = self._device_seconds(gs, self._local(rows, batch),
                                                               *([buckets] if buckets else []))
        t_comm = time.perf_counter()
        marks.append(self.now())
        # full: name -> reduced gradient of every parameter this rank receives (ZeRO-2: its shard's only)
        if buckets is not None:      # most buckets went out during backward: wait for the rest
            full, exposed = self._collective("reduction of the gradient buckets", buckets.finish, grads)
        elif scatter:
            full = self._reduce_scatter(grads, weight)
            exposed = time.perf_counter() - t_comm
        else:
            bucket = np.concatenate([grads[n].reshape(-1) for n in names]).astype(np.float32) * np.float32(weight)
            reduced = self._all_reduce("all-reduce of the gradients", bucket)
            exposed = time.perf_counter() - t_comm
            full, at = {}, 0
            for n in names:
                full[n] = reduced[at:at + grads[n].size].reshape(grads[n].shape)
                at += grads[n].size
        # NOTE: the local gradients are sent: drop them (ZeRO-2 keeps no gradient outside its shard)
        del grads
        gradient_bytes = sum(int(v.nbytes) for v in full.values())
        # loss, and every rank's time, slowdown and temperature in one small float64 sum: each rank
        # fills its own slots, so every rank learns them all and takes the same re-balancing decision
        w = self.world
        info = np.zeros(1 + 3 * w, np.float64)
        info[0], info[1 + self.rank], info[1 + w + self.rank] = loss * weight, device_s, slowdown
        info[1 + 2 * w + self.rank] = self.thermal.temperature if self.thermal else np.nan
        info = self._all_reduce("all-reduce of the loss", info)
        comm_s = time.perf_counter() - t_comm
        marks.append(self.now())
        self.params = self.optimizer.run(full)
        if self.shards:              # each rank updated its shard: everyone gets everyone's
            self.params = self._gather_shards(self.params)
        gs.set_parameters(self.params)
        marks.append(self.now())
        digest = self.digest()
        digests = self._collective("parameter check", self.comm.all_gather,
                                   self.backend.memory.to_device(np.array([digest], np.int64)))
        digests = [f"{int(np.asarray(self.backend.memory.to_host(d))[0]) & (2 ** 64 - 1):016x}" for d in digests]
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
        """A 64-bit fingerprint of every parameter's bytes, equal on two ranks only if the bits are."""
        h = hashlib.blake2b(digest_size=8)
        for n in sorted(self.params):
            h.update(np.ascontiguousarray(self.params[n]).tobytes())
        return int.from_bytes(h.digest(), "little", signed=True)

    def parameters(self) -> dict[str, np.ndarray]:
        return dict(self.params)


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
