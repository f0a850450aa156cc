"""Collectives: the third HDI module, over torch.distributed (gloo on CPU, nccl on CUDA).

    from opscope.runtime.comm import init_process_group
    init_process_group(rank, world_size, "tcp://127.0.0.1:29500")
    backend = resolve("numpy")
    total = backend.comm.all_reduce(np.ones(4, np.float32))     # numpy in, numpy out

A Communicator takes and returns the backend's own values (numpy arrays on numpy and sim
backends, tensors on torch backends), moving them through `backend.memory` when the process
group needs a tensor. We use torch.distributed's engine, not a home-made one.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .errors import UsageError

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
        "product": dist.ReduceOp.PRODUCT, "avg": None}


def init_process_group(rank: int, world_size: int, init_method: str, backend: str | None = None,
                       timeout_s: float = 120.0) -> str:
    """Join the default process group; `backend` defaults to nccl when CUDA is present, else gloo."""
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    if not dist.is_initialized():
        import datetime
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return backend


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class Communicator:
    """all_reduce / all_gather / reduce_scatter / broadcast / barrier / send / recv for one backend."""

    def __init__(self, backend, group=None):
        self.backend = backend
        self.group = group

    # --- the process group ---------------------------------------------------------------
    def _ready(self) -> None:
        if not dist.is_initialized():
            raise UsageError("collectives need a process group: call opscope.runtime.comm.init_process_group("
                             "rank, world_size, init_method) in every process first")

    @property
    def rank(self) -> int:
        self._ready()
        return dist.get_rank(self.group)

    @property
    def world_size(self) -> int:
        self._ready()
        return dist.get_world_size(self.group)

    @property
    def engine(self) -> str:
        """gloo or nccl: the torch.distributed backend of the group."""
        self._ready()
        return str(dist.get_backend(self.group))

    # --- backend values <-> tensors the process group accepts -----------------------------
    def _tensor(self, value) -> torch.Tensor:
        self._ready()
        if isinstance(value, torch.Tensor):
            t = value.detach()
            if self.engine == "gloo" and t.device.type != "cpu":
                t = t.cpu()       # gloo collectives are CPU collectives
            return t.contiguous().clone()
        return torch.from_numpy(self.backend.memory.to_host(value).copy()).contiguous()

    def _native(self, tensor: torch.Tensor, like):
        if isinstance(like, torch.Tensor):
            return tensor.to(like.device)
        return self.backend.memory.to_device(tensor)

    # --- collectives ---------------------------------------------------------------------
    def all_reduce(self, value, op: str = "sum"):
        t = self._tensor(value)
        if op == "avg":
            dist.all_reduce(t, dist.ReduceOp.SUM, group=self.group)
            t = t / self.world_size if t.is_floating_point() else t // self.world_size
        else:
            dist.all_reduce(t, self._op(op), group=self.group)
        return self._native(t, value)

    def all_gather(self, value) -> list:
        """One value per rank, in rank order."""
        t = self._tensor(value)
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(parts, t, group=self.group)
        return [self._native(p, value) for p in parts]

    def reduce_scatter(self, value, op: str = "sum"):
        """Reduce `value` over ranks and return this rank's slice of dim 0 (size must divide evenly).

        NOTE: gloo runs the real collective in torch 2.x (checked on 2.13, async too), as nccl does: 1/world
        of the traffic of an all-reduce."""
        t = self._tensor(value)
        n = self.world_size
        if t.shape[0] % n:
            raise UsageError(f"reduce_scatter: dim 0 ({t.shape[0]}) is not divisible by world size {n}")
        out = torch.empty((t.shape[0] // n,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
        _reduce_scatter()(out, t, self._op(op), group=self.group)
        return self._native(out, value)

    def broadcast(self, value, src: int = 0):
        t = self._tensor(value)
        dist.broadcast(t, src, group=self.group)
        return self._native(t, value)

    def barrier(self) -> None:
        self._ready()
        dist.barrier(group=self.group)

    def send(self, value, dst: int) -> None:
        dist.send(self._tensor(value), dst, group=self.group)

    def recv(self, like, src: int):
        """Receive into a value shaped like `like` (shape and dtype), from rank `src`."""
        t = torch.empty_like(self._tensor(like))
        dist.recv(t, src, group=self.group)
        return self._native(t, like)

    def _op(self, op: str):
        if op not in _OPS or _OPS[op] is None:
            raise UsageError(f"unknown reduce op {op!r}: use one of {', '.join(_OPS)}")
        return _OPS[op]


class PendingReduce:
    """A collective in flight (torch.distributed's async work handle): wait() returns its result as a CPU
    tensor. `send`: the buffer gloo reads from its own threads until then, held so long and let go after."""

    def __init__(self, work, tensor: torch.Tensor, send: torch.Tensor | None = None):
        self.work, self.tensor, self.send = work, tensor, send

    def wait(self) -> torch.Tensor:
        self.work.wait()
        self.send = None
        return self.tensor if self.tensor.device.type == "cpu" else self.tensor.cpu()


def _group_ready() -> None:
    if not dist.is_initialized():
        raise UsageError("collectives need a process group: call opscope.runtime.comm.init_process_group first")


def _reduce_scatter():
    # torch 2.12 renamed reduce_scatter_tensor to reduce_scatter_single (the old name warns)
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_reduce_async(tensor: torch.Tensor, group=None) -> PendingReduce:
    """Start a sum all-reduce of a CPU tensor and return at once (what DDP's reducer does per bucket)."""
    _group_ready()
    return PendingReduce(dist.all_reduce(tensor, dist.ReduceOp.SUM, group=group, async_op=True), tensor)


def reduce_scatter_async(flat: torch.Tensor, group=None) -> PendingReduce:
    """Start a sum reduce-scatter of a flat CPU tensor of world equal parts and return at once; rank r's
    wait() gives the sum of part r (ZeRO-2's bucket reduction). nccl takes device tensors: sent from one."""
    _group_ready()
    if dist.get_backend(group) == "nccl":
        flat = flat.to(torch.device("cuda", torch.cuda.current_device()))
    out = torch.empty(flat.shape[0] // dist.get_world_size(group), dtype=flat.dtype, device=flat.device)
    return PendingReduce(_reduce_scatter()(out, flat, dist.ReduceOp.SUM, group=group, async_op=True), out, flat)
