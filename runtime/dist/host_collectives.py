"""Collectives on a rank's host arrays, in place: what keeps a rank's process at one copy of its parameters and
gradients (the Communicator returns new values: a copy in, a copy out, each the size of what it carries).

    broadcast_(params[name], src=owner)            # the owner's values into every rank's array
    all_reduce_(grads_list, weight, cap_bytes)     # scaled and summed over ranks, bucket by bucket, back in place
    all_reduce_sum_(tensor)                        # a small CPU tensor summed over ranks, in place
    peak_rss_bytes(), rss_bytes()                  # this process's high-water mark and current resident set

A bucket is at most cap_bytes (DDP's 25 MiB by default): a small model's gradients go in one all-reduce as
before, a large one's never need a second full-size buffer.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.distributed as dist

BUCKET_BYTES = 25 * 2 ** 20


def _tensor(a: np.ndarray) -> tuple[torch.Tensor, bool]:
    """(a tensor the process group accepts that views `a` where it can, whether it must be copied back)."""
    t = torch.from_numpy(a)
    if dist.get_backend() == "nccl":          # nccl takes device tensors only
        return t.to(torch.device("cuda", torch.cuda.current_device())), True
    return t, False


def broadcast_(a: np.ndarray, src: int) -> None:
    """Rank `src`'s values into `a` on every rank (a contiguous array)."""
    t, back = _tensor(a)
    dist.broadcast(t, src)
    if back:
        np.copyto(a, t.cpu().numpy())


def all_reduce_sum_(t: torch.Tensor) -> None:
    """A CPU tensor of any dtype summed over the ranks, in place (--sync-bn's float64 statistics)."""
    if dist.get_backend() == "nccl":
        d = t.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(d)
        t.copy_(d.cpu())
    else:
        dist.all_reduce(t)


def reduce_async(t: torch.Tensor, dst: int):
    """Start a sum of a CPU tensor over the ranks into rank `dst`'s tensor (in place there) and return at once:
    a PendingReduce whose wait() gives the sum on `dst` (ZeRO-2's bucket of one owner's gradients)."""
    from ..comm import PendingReduce
    if dist.get_backend() == "nccl":
        t = t.to(torch.device("cuda", torch.cuda.current_device()))
    return PendingReduce(dist.reduce(t, dst, dist.ReduceOp.SUM, async_op=True), t)


def all_reduce_(arrays: list[np.ndarray], weight: float, cap_bytes: int = BUCKET_BYTES) -> None:
    """Every array scaled by `weight` (float32, as one flat buffer times weight would be) and summed over the
    ranks, in place; the arrays travel in buckets of at most cap_bytes, each one all-reduce."""
    w = np.float32(weight)
    i = 0
    while i < len(arrays):
        j, size = i, 0
        while j < len(arrays) and (j == i or size + arrays[j].nbytes <= cap_bytes):
            size += arrays[j].nbytes
            j += 1
        group = arrays[i:j]
        flat = np.concatenate([a.reshape(-1) for a in group]).astype(np.float32, copy=False)
        flat *= w
        t, back = _tensor(flat)
        dist.all_reduce(t, dist.ReduceOp.SUM)
        if back:
            flat = t.cpu().numpy()
        at = 0
        for a in group:
            np.copyto(a, flat[at:at + a.size].reshape(a.shape))     # a gradient may be a strided view
            at += a.size
        i = j


M_MMAP_THRESHOLD = -3             # glibc's mallopt parameter


def return_freed_memory(threshold: int = 1 << 20) -> bool:
    """Large blocks (>= threshold) come from mmap and go back to the system when freed (glibc only; False
    elsewhere). glibc raises its mmap threshold to the largest block freed so far (up to 32 MiB), after which a
    step's parameter-sized gradients and buffers come from the heap, whose freed memory the process keeps: each
    step then left a rank's resident set higher than the last, and a peak that is no strategy's."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        return False


def peak_rss_bytes() -> int | None:
    """The process's peak resident set so far (getrusage's ru_maxrss: KiB on Linux, bytes on macOS); None
    where the platform has no getrusage (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def rss_bytes() -> int | None:
    """The process's resident set now (Linux's /proc; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
